"""What SJF-BCO and the paper's baselines share: list scheduling under a per-GPU busy-time cap theta, and the
bisection on theta (Alg. 1 of Yu et al., MobiHoc 2022; section 7 gives each baseline its own theta).

A list scheduler takes jobs in an order (``JobOrder``), finds the GPUs whose booked work plus the job's
estimated time stays under theta, lets a rule pick G_j of them, and books the job on them from the slot the
last of them is free for its estimated execution time (``Books.place``). ``engine.run`` then measures the
schedule with the full model; the estimates only steer the choices.
"""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Protocol, TypeVar

import numpy as np

from .engine import Outcome, Schedule, run
from .instance import Instance


class JobOrder(Enum):
    """The order a list scheduler takes jobs in: as they arrive (the instance's order), or smallest first
    (G_j ascending, ties in arrival order: SJF-BCO's order)."""

    ARRIVAL = "arrival"
    SJF = "sjf"


def job_order(inst: Instance, order: JobOrder) -> list[int]:
    """The job ids in ``order``."""
    if order is JobOrder.SJF:
        return [int(j) for j in np.argsort(inst.gpus, kind="stable")]
    return list(range(inst.n_jobs))


class Start(Enum):
    """When a job placed under the cap starts (the paper's Alg. 2-3 leave it open).

    WAIT: as Alg. 2 lines 8-9 read: only GPUs idle now (and under the cap) are available; with too few, the
    scheduler waits for a running job to end; jobs start in list order (first-come-first-served).
    BOOK: every GPU under the cap is available; the job starts when the last of the chosen GPUs is free (a
    later job may start before an earlier one).
    """

    WAIT = "wait"
    BOOK = "book"


class Books:
    """What a list scheduler knows while placing: per GPU the slot it is free and the work booked on it."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.free = np.zeros(inst.n_gpus)
        self.busy = np.zeros(inst.n_gpus)
        self.split: list[list[tuple[float, float]]] = [[] for _ in range(inst.n_servers)]
        self.gpus: list[np.ndarray] = [np.empty(0, np.int64)] * inst.n_jobs
        self.order: list[int] = []

    def place(self, j: int, g: np.ndarray, at: float = 0.0) -> float:
        """Book job ``j`` on GPUs ``g`` from the slot they are all free (not before ``at``); returns how many
        slots it runs."""
        inst = self.inst
        servers = np.unique(inst.server_of[g])
        start = max(float(self.free[g].max()), at)
        p = 0
        if len(servers) > 1:
            p = 1 + max(sum(1 for a, b in self.split[s] if a <= start < b) for s in servers)
        d = inst.slots(j, len(servers), p)
        self.free[g] = start + d
        self.busy[g] += d
        if len(servers) > 1:
            for s in servers:
                self.split[s].append((start, start + d))
        self.gpus[j] = np.asarray(g, dtype=np.int64)
        self.order.append(j)
        return d

    def schedule(self) -> Schedule:
        """What was booked so far, as a Schedule for the engine."""
        return Schedule(list(self.order), list(self.gpus))


# A placement rule: given the books, a job and the GPUs under the cap (ascending ids), the G_j GPUs it takes.
Pick = Callable[[Books, int, np.ndarray], np.ndarray]


def rho0(inst: Instance) -> np.ndarray:
    """Per job the estimated time the cap is checked with: its shortest time (``Instance.min_slots``), known
    before its GPUs are picked."""
    return inst.shortest.astype(float)


def capped_schedule(inst: Instance, order: list[int], theta: float, pick: Pick, rho: np.ndarray | None = None,
                    start: Start = Start.BOOK) -> Schedule | None:
    """Take the jobs in ``order``; each goes on the GPUs ``pick`` chooses among those whose booked work plus
    its estimated time stays <= ``theta`` (and, with ``Start.WAIT``, that are idle at the current slot, which
    moves to the next job end while too few are). None when some job finds fewer than G_j such GPUs."""
    b = Books(inst)
    r = rho0(inst) if rho is None else rho
    now = 0.0
    for j in order:
        under = b.busy + r[j] <= theta
        if under.sum() < inst.gpus[j]:
            return None
        if start is Start.BOOK:
            b.place(int(j), pick(b, int(j), np.flatnonzero(under)))
            continue
        while (idle := under & (b.free <= now)).sum() < inst.gpus[j]:
            now = float(b.free[under & (b.free > now)].min())
        b.place(int(j), pick(b, int(j), np.flatnonzero(idle)), now)
    s = b.schedule()
    s.fifo = start is Start.WAIT
    return s


class Judge:
    """``engine.run`` with a memo: during a bisection many thetas give the same schedule."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.seen: dict[tuple, Outcome] = {}

    def __call__(self, s: Schedule) -> Outcome:
        """How ``s`` runs (computed once per distinct schedule)."""
        key = (tuple(s.order), s.fifo, b"".join(np.asarray(g, np.int64).tobytes() + b"|" for g in s.gpus))
        if key not in self.seen:
            self.seen[key] = run(self.inst, s)
        return self.seen[key]


class Measured(Protocol):
    """Anything that carries the engine's outcome of a schedule."""

    @property
    def outcome(self) -> Outcome:
        """How the schedule ran."""
        ...


M = TypeVar("M", bound=Measured)


def bisect_theta(at: Callable[[float], M | None], horizon: float) -> tuple[M, float]:
    """Alg. 1's bisection on theta in [1, ``horizon``], keeping the best makespan: a trial that is feasible and
    no worse moves the upper end down, anything else moves the lower end up; if even theta = ``horizon`` is
    infeasible, it doubles. Returns the best result and its theta."""
    hi = float(horizon)
    while (best := at(hi)) is None:
        hi *= 2
    theta, lo = hi, 0.0
    while hi - lo > 1:
        mid = float(int((lo + hi) / 2))
        r = at(mid)
        if r is not None and r.outcome.makespan <= best.outcome.makespan:
            best, theta, hi = r, mid, mid
        else:
            lo = mid
    return best, theta


def least_busy(b: Books, cand: np.ndarray, k: int) -> np.ndarray:
    """The k GPUs of ``cand`` with the least booked work, ties to the lower server (then GPU) index."""
    return cand[np.lexsort((b.inst.server_of[cand], b.busy[cand]))][:k]
