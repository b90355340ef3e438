"""Run a placement in the slotted model: the one judge every policy is measured by.

A policy hands over a ``Schedule``: an order of jobs and the GPUs of each. Each GPU runs its jobs in that order;
a job starts (gang) in the slot its last GPU becomes free (with ``fifo``, and not before the job before it in the
order has started: first-come-first-served without overtaking) and keeps its GPUs until it has done F_j iterations
(no preemption, no migration). Between starts and ends nothing changes, so the engine jumps from event to event;
at each it recomputes every running job's contention (eq. 6) and iterations per slot (eqs. 7-8).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .instance import Instance
from .model import contention, iteration_time, iterations_per_slot


@dataclass
class Schedule:
    """A policy's answer: the order jobs are queued in and the GPUs each job runs on."""

    order: list[int]
    gpus: list[np.ndarray]          # per job (indexed by job id): its global GPU ids
    fifo: bool = False              # no job starts before the one before it in ``order``


@dataclass
class Outcome:
    """When each job started and ended (slots), as the engine ran a schedule."""

    start: np.ndarray
    end: np.ndarray

    @property
    def makespan(self) -> int:
        """The slot the last job ends in."""
        return int(self.end.max())

    @property
    def mean_jct(self) -> float:
        """Mean job completion time (every job arrives at t = 0, so its end)."""
        return float(self.end.mean())


def layout(inst: Instance, gpus: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per job: servers spanned, and split[j, s] (0 < y_js < G_j)."""
    y = np.zeros((inst.n_jobs, inst.n_servers), dtype=np.int64)
    for j, g in enumerate(gpus):
        np.add.at(y[j], inst.server_of[g], 1)
    spans = (y > 0).sum(axis=1)
    split = (y > 0) & (y < inst.gpus[:, None])
    return spans, split


def _check(inst: Instance, sched: Schedule) -> None:
    """A schedule lists every job once, each on as many distinct, existing GPUs as it needs."""
    if sorted(sched.order) != list(range(inst.n_jobs)):
        raise ValueError("Schedule.order must list every job exactly once")
    for j in range(inst.n_jobs):
        g = np.asarray(sched.gpus[j])
        if len(g) != inst.gpus[j] or len(np.unique(g)) != len(g) or g.min() < 0 or g.max() >= inst.n_gpus:
            raise ValueError(f"job {j}: needs {inst.gpus[j]} distinct GPU ids in 0..{inst.n_gpus - 1}, got "
                             f"{g.tolist()}")


def run(inst: Instance, sched: Schedule) -> Outcome:
    """Play ``sched`` on ``inst`` event by event (the module docstring's rules): when each job starts and ends."""
    n = inst.n_jobs
    _check(inst, sched)
    spans, split = layout(inst, sched.gpus)
    # each job waits for the previous user of each of its GPUs
    last = np.full(inst.n_gpus, -1)
    waits = np.zeros(n, dtype=np.int64)
    succ: list[list[int]] = [[] for _ in range(n)]
    for j in sched.order:
        prev = set(last[sched.gpus[j]].tolist()) - {-1}
        waits[j] = len(prev)
        for p in prev:
            succ[p].append(j)
        last[sched.gpus[j]] = j
    start = np.full(n, -1, dtype=np.int64)
    end = np.full(n, -1, dtype=np.int64)
    left = inst.iters.astype(np.int64).copy()
    running = np.zeros(n, dtype=bool)
    ready = [j for j in range(n) if waits[j] == 0]
    rank = np.empty(n, dtype=np.int64)
    rank[sched.order] = np.arange(n)
    t = 0
    done = 0
    started = 0                     # with fifo: jobs order[:started] have started
    while done < n:
        if sched.fifo:
            free = set(ready)
            while started < n and sched.order[started] in free:
                j = sched.order[started]
                running[j], start[j] = True, t
                free.discard(j)
                started += 1
            ready = sorted(free, key=lambda j: rank[j])
        else:
            for j in ready:
                running[j] = True
                start[j] = t
            ready = []
        idx = np.flatnonzero(running)
        p = contention(split[idx])
        ips = iterations_per_slot(iteration_time(inst.gpus[idx], spans[idx], p, inst.grad[idx],
                                                 inst.compute[idx], inst.params))
        need = -(-left[idx] // ips)
        dt = int(need.min())
        t += dt
        left[idx] -= ips * dt
        for j in idx[left[idx] <= 0]:
            running[j] = False
            end[j] = t
            done += 1
            for s in succ[j]:
                waits[s] -= 1
                if waits[s] == 0:
                    ready.append(s)
    return Outcome(start, end)
