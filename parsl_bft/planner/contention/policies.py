"""SJF-BCO (Yu et al., MobiHoc 2022, Alg. 1-3), and readings of its baselines without a busy-time cap.

SJF-BCO is a list scheduler under a per-GPU busy-time cap theta (``booking.capped_schedule``, where the
start reading ``Start`` and the bisection live). Choices the paper leaves open (each tested; the full table is
in docs/explanation/sjf-bco.md):
- rho-hat: eligibility under theta uses the job's shortest time (``Instance.min_slots``: fewest servers, alone
  on its links), known before the GPUs are picked; the busy time added is the estimate for the GPUs picked;
- busy times start from zero in every (theta, kappa) trial; u = l = 1 (busy times in slots);
- kappa: only the distinct job sizes are tried - any kappa between two sizes splits the jobs the same way;
- ties between equally busy GPUs go to the lower server index (small jobs pack onto one server).

The paper's baselines (each under its own theta) are in ``baselines``. The functions here are readings without
a cap, in arrival order, reported beside them: ``first_fit`` (first-come-first-served on the fewest servers),
``first_fit_backfill`` (any first free GPUs), ``list_scheduling`` (least booked work at the first slot G_j GPUs
are free), ``random_placement`` (G_j random free GPUs) and ``random_servers`` (random servers, waiting for them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import BadValue
from .booking import Books, JobOrder, Judge, Start, bisect_theta, capped_schedule, job_order, least_busy
from .engine import Outcome, Schedule
from .instance import Instance


def _earliest(b: Books, k: int, not_before: float = 0.0) -> np.ndarray:
    """The GPUs free at the first slot (>= ``not_before``) at which k of them are free, in index order."""
    t = max(float(np.partition(b.free, k - 1)[k - 1]), not_before)
    return np.flatnonzero(b.free <= t)


def first_fit(inst: Instance, seed: int = 0) -> Schedule:
    """First-come-first-served First-Fit on the fewest servers: in arrival order, no job starting before the
    one before it, each job waits for the first slot at which the fewest servers that could ever hold it
    (``Instance.min_servers``) have G_j free GPUs between them - the first such server in index order when one
    suffices, else those with the most free GPUs - and takes their free GPUs server by server."""
    b = Books(inst)
    last = 0.0
    for j in range(inst.n_jobs):
        k, m = int(inst.gpus[j]), inst.min_servers(j)
        for t in np.unique(np.maximum(b.free, last)):
            idle = b.free <= t
            count = np.bincount(inst.server_of[idle], minlength=inst.n_servers)
            servers = np.argsort(-count, kind="stable")[:m]
            if count[servers].sum() >= k:
                if m == 1:
                    servers = np.flatnonzero(count >= k)[:1]
                cand = np.flatnonzero(idle & np.isin(inst.server_of, servers))
                g = cand[np.argsort(inst.server_of[cand], kind="stable")][:k]
                break
        last = float(b.free[g].max())
        b.place(j, g)
    s = b.schedule()
    s.fifo = True
    return s


def first_fit_backfill(inst: Instance, seed: int = 0) -> Schedule:
    """First-Fit that neither waits for few servers nor keeps the order: at the first slot G_j GPUs are free,
    the first of them server by server (not the paper's baseline as we read it; reported beside it)."""
    b = Books(inst)
    for j in range(inst.n_jobs):
        k = int(inst.gpus[j])
        b.place(j, _earliest(b, k)[:k])
    return b.schedule()


def list_scheduling(inst: Instance, seed: int = 0) -> Schedule:
    """Graham's list scheduling: in arrival order, at the first slot G_j GPUs are free, the G_j of them with the
    least work booked so far (whatever servers they are on)."""
    b = Books(inst)
    for j in range(inst.n_jobs):
        k = int(inst.gpus[j])
        cand = _earliest(b, k)
        b.place(j, cand[np.argsort(b.busy[cand], kind="stable")[:k]])
    return b.schedule()


def random_placement(inst: Instance, seed: int = 0) -> Schedule:
    """Random: in arrival order, at the first slot G_j GPUs are free, G_j of them at random."""
    rng = np.random.default_rng(seed)
    b = Books(inst)
    for j in range(inst.n_jobs):
        k = int(inst.gpus[j])
        b.place(j, rng.choice(_earliest(b, k), size=k, replace=False))
    return b.schedule()


def random_servers(inst: Instance, seed: int = 0) -> Schedule:
    """Random, the other reading: in arrival order, servers in random order until they hold G_j GPUs, and the
    G_j of their GPUs free first; the job waits for them (reported beside ``random_placement``, which only
    draws among the GPUs free at the earliest slot and so never waits longer than List-Scheduling)."""
    rng = np.random.default_rng(seed)
    b = Books(inst)
    for j in range(inst.n_jobs):
        k = int(inst.gpus[j])
        order = rng.permutation(inst.n_servers)
        n = int(np.searchsorted(np.cumsum(inst.server_gpus[order]), k)) + 1
        cand = np.flatnonzero(np.isin(inst.server_of, order[:n]))
        b.place(j, cand[np.argsort(b.free[cand], kind="stable")][:k])
    return b.schedule()


def _lbsgf(b: Books, j: int, eligible: np.ndarray, lam: float) -> np.ndarray:
    """Alg. 3: servers by mean busy time; the fewest least-busy ones holding >= lambda * G_j eligible GPUs (all
    servers with eligible GPUs if none do); then the G_j least busy eligible GPUs on them."""
    inst = b.inst
    mean_busy = np.bincount(inst.server_of, weights=b.busy, minlength=inst.n_servers) / inst.server_gpus
    per_server = np.bincount(inst.server_of[eligible], minlength=inst.n_servers)
    order = np.argsort(mean_busy, kind="stable")
    enough = np.flatnonzero(np.cumsum(per_server[order]) >= lam * inst.gpus[j])
    chosen = order[: enough[0] + 1] if len(enough) else order
    return least_busy(b, eligible[np.isin(inst.server_of[eligible], chosen)], int(inst.gpus[j]))


def sjf_bco_trial(inst: Instance, theta: float, kappa: int, lam: float = 1.0, order: JobOrder = JobOrder.SJF,
                  start: Start = Start.BOOK) -> Schedule | None:
    """One (theta, kappa) trial of Alg. 1: jobs in ``order`` (smallest first); a job of <= kappa GPUs by FA-FFP
    (Alg. 2: the G_j least busy GPUs under the cap, which is also List-Scheduling's rule), a larger one by LBSGF
    (Alg. 3). None when some job finds too few GPUs under the busy-time cap theta."""
    def pick(b: Books, j: int, eligible: np.ndarray) -> np.ndarray:
        if inst.gpus[j] <= kappa:
            return least_busy(b, eligible, int(inst.gpus[j]))
        return _lbsgf(b, j, eligible, lam)
    return capped_schedule(inst, job_order(inst, order), theta, pick, start=start)


def kappa_choices(inst: Instance) -> list[int]:
    """The spread thresholds SJF-BCO tries: every job size in the instance."""
    return sorted(set(inst.gpus.tolist()))


@dataclass
class BcoResult:
    """SJF-BCO's best schedule, how it ran, the (theta, kappa) that gave it and every trial on the way."""

    schedule: Schedule
    outcome: Outcome
    theta: float
    kappa: int
    trials: int
    log: list[tuple[float, int, int | None]] = field(default_factory=list)   # (theta, kappa, makespan)


def sjf_bco(inst: Instance, *, horizon: int = 1200, kappas: list[int] | None = None, lam: float = 1.0,
            order: JobOrder = JobOrder.SJF, start: Start = Start.BOOK) -> BcoResult:
    """Alg. 1: bisection on the per-GPU busy-time cap theta in [1, ``horizon``] (``bisect_theta``); at each theta
    every spread threshold kappa (``kappas``; default ``kappa_choices``) is tried and the best makespan kept.
    ``lam`` is the lambda_j of LBSGF, the same for every job (the paper's evaluation: 1). ``order`` other than
    SJF is an ablation (SJF-BCO's placement in arrival order); ``start`` says when a placed job starts."""
    if lam < 1:
        raise BadValue(f"lambda must be >= 1 (LBSGF looks at servers holding >= lambda * G_j GPUs), got {lam}")
    ks = kappas or kappa_choices(inst)
    log: list[tuple[float, int, int | None]] = []
    judge = Judge(inst)

    def at(theta: float) -> BcoResult | None:
        top = None
        for k in ks:
            s = sjf_bco_trial(inst, theta, k, lam, order, start)
            out = judge(s) if s is not None else None
            log.append((theta, k, out.makespan if out else None))
            if s is not None and out is not None and (top is None or out.makespan < top.outcome.makespan):
                top = BcoResult(s, out, theta, k, 0)
        return top

    best, _ = bisect_theta(at, horizon)
    best.trials, best.log = len(log), log
    return best


POLICIES = {"ff": first_fit, "ls": list_scheduling, "rand": random_placement, "ff-bf": first_fit_backfill,
            "rand-srv": random_servers}
