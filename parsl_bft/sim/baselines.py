"""Baseline schedulers for the dedicated-cluster replay: rigid jobs, each run at the size it asked for or not at
all, beside parsl-bft's elastic planner on the same jobs and the same replay (``simulate``). They answer the
Controller's ``plan`` like any planner. A job's requested size is its ``spec.max_nodes``: give them a rigid job
set (``philly.read_philly(..., rigid=True)``: min_nodes = max_nodes = the GPUs the trace's job asked for).

- ``FifoBackfill``: a non-elastic gang scheduler. Jobs start in arrival order when their nodes are free and
  run to the end (no preemption); EASY backfilling lets a later job start early when it fits the free nodes and
  does not delay the first waiting job's reservation. Run times come from the replay's rate model (exact: the
  best case for backfilling, which in practice has only the users' estimates).
- ``TiresiasLas``: a Tiresias-like discretised two-dimensional least-attained-service scheduler (Gu et al.,
  NSDI 2019): a job's attained service is its GPU-seconds so far; ``thresholds`` split the jobs into priority
  queues (fewer GPU-seconds first, arrival order within a queue); jobs are placed in that order at their
  requested size, skipping those that do not fit, and a running job that no longer makes the cut is preempted
  (it pays ``t_down`` like any shrink). Decisions are taken when the replay plans: at arrivals, completions and
  the freezable jobs' statistic reports (every 2 % of a job's progress), not on a timer.

Neither models IceFrog's testbed or its baselines' implementations: they are the classes of scheduler an
elastic, layer-aware one is usually measured against, on parsl-bft's own rate and cost model.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..planner.problem import JobState, Plan


def _plan(jobs: list[JobState], pool: list[str], sizes: dict[str, int], method: str, t0: float) -> Plan:
    """The Plan for ``sizes``: a job that keeps running keeps its nodes, a started one takes free ones."""
    pool_set = set(pool)
    keep = {j.name: j.nodes for j in jobs if sizes[j.name] and sizes[j.name] == j.size}
    used = {n for nodes in keep.values() for n in nodes}
    free = iter(sorted(pool_set - used))
    alloc = {j.name: keep.get(j.name) or tuple(next(free) for _ in range(sizes[j.name])) for j in jobs}
    costs = {j.name: (j.spec.t_down if sizes[j.name] < j.size else 0.0) * j.rate() for j in jobs}
    rates = {j.name: j.curve.rate(sizes[j.name]) for j in jobs}
    return Plan(alloc, sizes, rates, costs, 0.0, method, "heuristic", time.perf_counter() - t0, [],
                {j.name: j.freeze for j in jobs})


def _arrival(j: JobState) -> tuple[float, str]:
    return j.spec.submit, j.name


@dataclass
class FifoBackfill:
    """First-come-first-served gang scheduling at the requested sizes with EASY backfilling (module doc)."""

    method: str = "fifo-backfill"

    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0,
             remaining: dict[str, float] | None = None) -> Plan:
        """Running jobs go on; waiting ones start in arrival order, later ones backfilled (module doc)."""
        t0 = time.perf_counter()
        sizes = {j.name: j.size for j in jobs}
        free = len(pool) - sum(sizes.values())
        ends = sorted((now + j.remaining / max(j.rate(), 1e-12), j.size) for j in jobs if j.size)
        waiting = sorted((j for j in jobs if not j.size), key=_arrival)
        shadow, extra = math.inf, 0
        for j in waiting:
            need = j.spec.max_nodes
            if need > len(pool):
                continue                       # can never run here (the replay reports it unfinished)
            if math.isinf(shadow):             # no reservation yet: start in order while the head fits
                if need <= free:
                    sizes[j.name], free = need, free - need
                    ends.append((now + j.remaining / j.curve.rate(need), need))
                    ends.sort()
                    continue
                shadow, extra = _reservation(ends, free, need)
                continue
            run = j.remaining / j.curve.rate(need)
            if need <= free and (now + run <= shadow or need <= extra):
                sizes[j.name], free = need, free - need
                if now + run > shadow:
                    extra -= need
        return _plan(jobs, pool, sizes, self.method, t0)


def _reservation(ends: list[tuple[float, int]], free: int, need: int) -> tuple[float, int]:
    """When the first waiting job (``need`` nodes) can start as the running jobs end (``ends``: (end, size),
    soonest first), and the nodes then free beyond its need (what a backfilled job may hold past that time)."""
    for end, size in ends:
        free += size
        if free >= need:
            return end, free - need
    return math.inf, 0


@dataclass
class TiresiasLas:
    """Discretised 2D least-attained-service at the requested sizes, preemptive (module doc). ``thresholds``:
    the GPU-seconds of attained service at which a job moves down one queue."""

    thresholds: tuple[float, ...] = (3600.0,)
    method: str = "tiresias-las"
    attained: dict[str, float] = field(default_factory=dict)
    _last: float | None = field(default=None, repr=False)

    def queue(self, name: str) -> int:
        """The priority queue of a job (0: highest) by its attained service."""
        a = self.attained.get(name, 0.0)
        return sum(a >= t for t in self.thresholds)

    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0,
             remaining: dict[str, float] | None = None) -> Plan:
        """Attained service counted since the last plan; jobs placed in priority order where they fit."""
        t0 = time.perf_counter()
        dt = now - self._last if self._last is not None else 0.0
        self._last = now
        for j in jobs:
            self.attained[j.name] = self.attained.get(j.name, 0.0) + j.size * dt
        sizes = {j.name: 0 for j in jobs}
        free = len(pool)
        for j in sorted(jobs, key=lambda j: (self.queue(j.name), *_arrival(j))):
            if j.spec.max_nodes <= free:
                sizes[j.name] = j.spec.max_nodes
                free -= j.spec.max_nodes
        return _plan(jobs, pool, sizes, self.method, t0)
