"""The baselines of SJF-BCO's evaluation as the paper defines them (Yu et al., MobiHoc 2022, section 7): each is
a list scheduler under a per-GPU busy-time cap theta (``booking.capped_schedule``) with its own theta.

- First-Fit (FF): the first G_j GPUs under the cap, server by server (GPU id order), theta bisected;
- List-Scheduling (LS): the G_j GPUs with the least booked work under the cap, theta bisected. This is
  FA-FFP's rule: SJF-BCO with kappa >= every job is LS in SJF order;
- Random (RAND): servers in random order, their GPUs under the cap in random order, the first G_j of them;
  theta = T (the paper: "to avoid the long running time").

The paper does not say in which order the baselines take jobs; every one runs in either ``JobOrder``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from .booking import Books, JobOrder, Judge, Pick, Start, bisect_theta, capped_schedule, job_order, least_busy
from .engine import Outcome, Schedule
from .instance import Instance


class Baseline(Enum):
    """The paper's baselines."""

    FF = "ff"
    LS = "ls"
    RAND = "rand"


@dataclass
class BaselineResult:
    """A baseline's schedule, how it ran, and the theta it ran under."""

    schedule: Schedule
    outcome: Outcome
    theta: float


def _first_fit(b: Books, j: int, eligible: np.ndarray) -> np.ndarray:
    return eligible[: int(b.inst.gpus[j])]


def _least_loaded(b: Books, j: int, eligible: np.ndarray) -> np.ndarray:
    return least_busy(b, eligible, int(b.inst.gpus[j]))


def _random(seed: int) -> Pick:
    rng = np.random.default_rng(seed)

    def pick(b: Books, j: int, eligible: np.ndarray) -> np.ndarray:
        rank = rng.permutation(b.inst.n_servers)[b.inst.server_of[eligible]]
        shuffled = eligible[np.lexsort((rng.random(len(eligible)), rank))]
        return shuffled[: int(b.inst.gpus[j])]
    return pick


def paper_baseline(inst: Instance, which: Baseline, order: JobOrder = JobOrder.ARRIVAL, *, horizon: int = 1200,
                   seed: int = 0, start: Start = Start.BOOK) -> BaselineResult:
    """Run ``which`` with jobs in ``order``: FF and LS under their own bisected theta in [1, ``horizon``] (the
    best makespan kept, as SJF-BCO's search does), RAND under theta = ``horizon`` (doubled while infeasible)."""
    jobs = job_order(inst, order)
    judge = Judge(inst)

    def at(theta: float, pick: Pick) -> BaselineResult | None:
        s = capped_schedule(inst, jobs, theta, pick, start=start)
        return None if s is None else BaselineResult(s, judge(s), theta)

    if which is Baseline.RAND:
        theta = float(horizon)
        while (r := at(theta, _random(seed))) is None:
            theta *= 2
        return r
    pick = _first_fit if which is Baseline.FF else _least_loaded
    best, _ = bisect_theta(lambda th: at(th, pick), horizon)
    return best
