"""When each job of a log ran: the Schedule that node assignment and 'idle while jobs wait' read.

Start times come either from the log (``recorded_schedule``: start = submit + wait) or from an FCFS +
EASY-backfill replay of the same jobs (easy.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .intervals import step_count
from .swf_format import F_WAIT, SwfTrace, field_label


@dataclass
class Schedule:
    """When each job ran: the input to node assignment and to 'idle while jobs wait'.

    Sizes and capacity are in cores when ``cores_per_node`` > 1 (jobs may share nodes), else in nodes."""

    capacity: int
    submit: np.ndarray
    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    kind: str
    cores_per_node: int = 1
    reservation: np.ndarray | None = None  # EASY: the first reservation made for a job at the queue head
    # EASY: what the scheduler knew, when: from times[i] on, the head's planned start is starts[i] (inf: none)
    reservation_timeline: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def waiting_count(self) -> tuple[np.ndarray, np.ndarray]:
        """Step function of jobs waiting in the queue: (times, count from times[i] on)."""
        w = self.start > self.submit
        return step_count(self.submit[w], self.start[w])


def recorded_schedule(trace: SwfTrace) -> Schedule:
    """The schedule as logged: start = submit + wait. Fails if the log has no waits or exceeds capacity."""
    if np.any(trace.wait < 0):
        n = int(np.sum(trace.wait < 0))
        raise InputError(trace.path, 0, field_label(F_WAIT),
                         f"{n} jobs have no wait time (-1): the recorded schedule is unknown; use --schedule easy")
    start = trace.submit + trace.wait
    return Schedule(trace.capacity, trace.submit, start, start + trace.run, trace.size, "recorded",
                    trace.cores_per_node)


def peak_usage(s: Schedule) -> tuple[float, int]:
    """(time, nodes) of the highest simultaneous use, ends before starts at equal times."""
    t = np.concatenate([s.end, s.start])
    d = np.concatenate([-s.size, s.size])
    order = np.lexsort((d, t))
    use = np.cumsum(d[order])
    i = int(np.argmax(use))
    return float(t[order][i]), int(use[i])
