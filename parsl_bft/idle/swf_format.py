"""The Standard Workload Format's fields and sanity caps, and SwfTrace: the jobs of one log as read_swf returns them.

SWF (one job per line, 18 fields, ``;`` header comments) records submit, wait, run time and size but no node ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# 1-based SWF field numbers
F_ID, F_SUBMIT, F_WAIT, F_RUN, F_ALLOC, F_AVGCPU, F_REQPROCS, F_REQTIME = 1, 2, 3, 4, 5, 6, 8, 9
FIELD_NAMES = {1: "job id", 2: "submit time", 3: "wait time", 4: "run time", 5: "allocated processors",
               6: "average cpu time", 8: "requested processors", 9: "requested time"}

MAX_VALUE = 1e12            # no SWF time or size is larger (s: 31,700 years; cores: ...): beyond it, a damaged line
MAX_NODES = 1_000_000       # capacity sanity caps: per-node arrays are allocated from these
MAX_CORES_PER_NODE = 100_000
# job lines a log may hold: the largest public logs hold under 6 million; past this a log is refused before its
# parse (about 70 bytes a job) and the replay's arrays take more memory than a login node has
MAX_JOB_LINES = 10_000_000


def field_label(num: int) -> str:
    """How an error names an SWF field: its number and name, e.g. ``3 (wait time)``."""
    return f"{num} ({FIELD_NAMES[num]})"


@dataclass
class SwfTrace:
    """Jobs of an SWF log, sorted by submit time, sized in the log's units (nodes or cores)."""

    path: str
    capacity: int                 # in ``units``
    job_id: np.ndarray
    submit: np.ndarray
    wait: np.ndarray              # -1 = unknown
    run: np.ndarray
    size: np.ndarray              # in ``units``
    estimate: np.ndarray          # the scheduler's runtime estimate: max(requested, run)
    units: str = "nodes"
    cores_per_node: int = 1       # 1 when units == "nodes"
    variant: str = "standard"
    skipped: dict[str, int] = field(default_factory=dict)   # rows ignored on purpose, by reason

    def __len__(self) -> int:
        return len(self.submit)
