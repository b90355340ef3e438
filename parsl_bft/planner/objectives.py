"""Objectives: what one second of a job running on k nodes is worth.

An objective maps (job, sizes 0..K) to a per-second utility U_j(k). The planner maximises
sum_j  T * U_j(n_j)  -  rescale pause_j * U_j(C_j), so the rescale cost is charged at the job's current rate
in the objective's own units (BFTrainer's model). Max-min fairness is not a sum; it restricts every job to sizes
that reach the best achievable minimum (see ``restrict``) and then maximises speedup - exact and solver-agnostic.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import BadValue
from .problem import JobState


class Objective:
    """Base class. Subclasses implement ``utility``; ``restrict`` may narrow the allowed sizes."""

    name = "objective"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """What one second of ``job`` on each number of nodes in ``ks`` is worth at ``now``."""
        raise NotImplementedError

    def restrict(self, jobs: list[JobState], allowed: list[np.ndarray], capacity: int) -> list[np.ndarray]:
        """The sizes each job may take (default: all of ``allowed``)."""
        return allowed

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Throughput(Objective):
    """Samples per second (favours models that are fast in absolute terms)."""

    name = "throughput"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """The measured samples/s at each size."""
        return job.curve.table(max(1, int(ks.max())))[ks]


class Speedup(Objective):
    """P(n)/P(1): every model counts by how much faster than one node it runs (no model is starved)."""

    name = "speedup"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """Each size's rate over the job's one-node rate."""
        t = job.curve.table(max(1, int(ks.max())))
        return t[ks] / t[1]


@dataclass
class Weighted(Objective):
    """A base objective times per-job weights: ``weights`` by job name (e.g. from a site file), else
    ``JobSpec.weight``."""

    base: Objective = field(default_factory=Speedup)
    weights: dict[str, float] = field(default_factory=dict)
    name = "weighted"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """The base objective's utility times the job's weight."""
        return self.weights.get(job.name, job.spec.weight) * self.base.utility(job, ks, now)


class ProportionalFair(Objective):
    """sum_j log(1 + speedup_j): diminishing returns spread nodes over jobs (log(0) would forbid idling one)."""

    name = "proportional"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """log(1 + speedup) at each size."""
        t = job.curve.table(max(1, int(ks.max())))
        return np.log1p(t[ks] / t[1])


class MaxMinFair(Objective):
    """Lexicographic max-min fairness on speedup: first the largest achievable minimum speedup over all jobs,
    then the most total speedup among allocations that reach it."""

    name = "maxmin"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """Speedup (the fairness is in ``restrict``)."""
        return Speedup().utility(job, ks, now)

    def restrict(self, jobs: list[JobState], allowed: list[np.ndarray], capacity: int) -> list[np.ndarray]:
        """Only the sizes at or above those that reach the largest achievable minimum speedup."""
        speed = [Speedup().utility(j, a, 0.0) for j, a in zip(jobs, allowed)]
        candidates = sorted({float(x) for s in speed for x in s}, reverse=True)

        def min_sizes(tau: float) -> list[int] | None:
            out = []
            for a, s in zip(allowed, speed):
                ok = np.flatnonzero(s >= tau - 1e-12)
                if not len(ok):
                    return None
                out.append(int(a[ok[0]]))
            return out

        lo, hi = len(candidates) - 1, 0     # candidates[lo] (0.0) is always feasible
        while hi < lo:                       # binary search for the largest feasible tau
            mid = (lo + hi) // 2
            m = min_sizes(candidates[mid])
            if m is not None and sum(m) <= capacity:
                lo = mid
            else:
                hi = mid + 1
        best = min_sizes(candidates[lo]) or [0] * len(jobs)
        return [a[a >= k] for a, k in zip(allowed, best)]


@dataclass
class DeadlineAware(Objective):
    """Speedup weighted by urgency: node-seconds of work left per second until the deadline (jobs without a
    deadline get ``default_urgency``), plus a small bonus for jobs close to done (finish what can finish)."""

    default_urgency: float = 1.0
    name = "deadline"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """Speedup times urgency and a bonus for nearly finished jobs."""
        c = job.curve
        if job.spec.deadline is not None:
            left = max(job.spec.deadline - now, 60.0)
            urgency = max(job.remaining / c.rate(1) / left, self.default_urgency)
        else:
            urgency = self.default_urgency
        near_done = 1.0 + 1.0 / (1.0 + job.remaining / (c.rate(1) * 3600.0))
        return urgency * near_done * Speedup().utility(job, ks, now)


class AverageJCT(Objective):
    """Minimise average job completion time: a second at k nodes is worth the share of the job's remaining work
    it does, P(k) / remaining (the shortest-remaining-time-first rule as a rate: short jobs first, and among
    equal ones the size that finishes them soonest). With layer elasticity P is the effective rate."""

    name = "jct"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """The share of the job's remaining work one second at each size does."""
        return job.curve.table(max(1, int(ks.max())))[ks] / max(job.remaining, 1.0)


@dataclass
class UserDefined(Objective):
    """The administrator's or user's own metric: ``fn(job, k) -> value per second``."""

    fn: Callable[[JobState, int], float] = lambda job, k: float(k)
    name = "user"

    def utility(self, job: JobState, ks: np.ndarray, now: float) -> np.ndarray:
        """``fn(job, k)`` at each size (0 at size 0)."""
        return np.array([self.fn(job, int(k)) if k else 0.0 for k in ks], dtype=float)


OBJECTIVES: dict[str, Callable[[], Objective]] = {
    "throughput": Throughput, "speedup": Speedup, "weighted": Weighted, "proportional": ProportionalFair,
    "maxmin": MaxMinFair, "deadline": DeadlineAware, "jct": AverageJCT,
}


def make_objective(name: str | Objective) -> Objective:
    """An objective by its name in ``OBJECTIVES`` (an Objective passes through)."""
    if isinstance(name, Objective):
        return name
    try:
        return OBJECTIVES[name]()
    except KeyError:
        raise BadValue(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}") from None


__all__ = ["OBJECTIVES", "AverageJCT", "DeadlineAware", "MaxMinFair", "Objective", "ProportionalFair", "Speedup",
           "Throughput", "UserDefined", "Weighted", "make_objective"]
