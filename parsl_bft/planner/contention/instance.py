"""The paper's offline, slotted setting: servers with identical GPUs, ring-all-reduce jobs all present at t = 0,
and the random instances of its evaluation (section 7)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from ...errors import BadValue
from .model import CommParams, degradation, iteration_time, iterations_per_slot

# section 7: 160 jobs scaled from the Philly trace's size distribution (GPUs -> count)
PAPER_MIX = {1: 80, 2: 14, 4: 26, 8: 30, 16: 8, 32: 2}
PAPER_SERVER_GPUS = (4, 8, 16, 32)


@dataclass(frozen=True)
class Instance:
    """``server_gpus[s]`` = O_s; per job j: ``gpus`` G_j, ``iters`` F_j, ``grad`` m_j, ``compute`` (forward +
    backward per iteration, slots). Job order is the arrival order the order-keeping baselines use."""

    server_gpus: np.ndarray
    gpus: np.ndarray
    iters: np.ndarray
    grad: np.ndarray
    compute: np.ndarray
    params: CommParams = field(default_factory=CommParams)
    server_of: np.ndarray = field(init=False, repr=False, compare=False)   # GPU id -> its server
    _slots: dict[tuple[int, int, int], int] = field(init=False, repr=False, compare=False)   # slots()'s memo

    def __post_init__(self) -> None:
        n = len(self.gpus)
        for name in ("iters", "grad", "compute"):
            if len(getattr(self, name)) != n:
                raise BadValue(f"Instance.{name} has {len(getattr(self, name))} entries for {n} jobs")
        if len(self.server_gpus) == 0 or np.any(np.asarray(self.server_gpus) < 1):
            raise BadValue(f"Instance.server_gpus must be >= 1 each, got {list(self.server_gpus)}")
        if np.any(np.asarray(self.gpus) < 1) or np.any(np.asarray(self.gpus) > np.sum(self.server_gpus)):
            raise BadValue(f"job sizes must be in 1..{int(np.sum(self.server_gpus))} GPUs, got "
                           f"{sorted(set(np.asarray(self.gpus).tolist()))}")
        if np.any(np.asarray(self.iters) < 1):
            raise BadValue("every job needs >= 1 iteration")
        server_of = np.repeat(np.arange(len(self.server_gpus)), self.server_gpus)
        object.__setattr__(self, "server_of", server_of)
        object.__setattr__(self, "_slots", {})

    @property
    def n_jobs(self) -> int:
        """Jobs in the instance."""
        return len(self.gpus)

    @property
    def n_gpus(self) -> int:
        """GPUs over all servers."""
        return int(np.sum(self.server_gpus))

    @property
    def n_servers(self) -> int:
        """Servers in the cluster."""
        return len(self.server_gpus)

    def slots(self, j: int, servers: int, p: int) -> int:
        """Execution time of job j in slots when it spans ``servers`` with a constant contention count ``p``."""
        key = (int(j), int(servers), int(p))
        if key not in self._slots:
            tau = iteration_time(self.gpus[j], servers, p, self.grad[j], self.compute[j], self.params)
            self._slots[key] = int(-(-int(self.iters[j]) // int(iterations_per_slot(tau))))
        return self._slots[key]

    @cached_property
    def shortest(self) -> np.ndarray:
        """``min_slots`` of every job."""
        return np.array([self.min_slots(j) for j in range(self.n_jobs)], dtype=np.int64)

    def min_slots(self, j: int) -> int:
        """Job j's shortest possible execution time: on the fewest servers that hold it, alone on its links."""
        s = self.min_servers(j)
        return self.slots(j, s, 1 if s > 1 else 0)

    def min_servers(self, j: int) -> int:
        """Fewest servers that can hold job j (largest servers first)."""
        return int(np.searchsorted(np.cumsum(np.sort(self.server_gpus)[::-1]), self.gpus[j]) + 1)


def lower_bound(inst: Instance) -> int:
    """A lower bound on every schedule's makespan: the largest of the work bound (GPU-slots of every job at its
    shortest time over the GPUs), the longest job, and the jobs needing more than half the GPUs back to back."""
    short = inst.shortest
    work = int(-(-int(np.dot(inst.gpus, short)) // inst.n_gpus))
    big = int(short[2 * inst.gpus > inst.n_gpus].sum())
    return max(work, int(short.max()), big)


def _draw_cluster(rng: np.random.Generator, mix: dict[int, int], servers: int,
                  server_choices: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Jobs of ``mix`` in random order and ``servers`` drawn from ``server_choices`` (redrawn until the largest
    job fits the cluster)."""
    gpus = rng.permutation(np.repeat(list(mix), list(mix.values())))
    server_gpus = rng.choice(server_choices, size=servers)
    while server_gpus.sum() < gpus.max():
        server_gpus = rng.choice(server_choices, size=servers)
    return gpus, server_gpus


def _calibrate(gpus: np.ndarray, tau1: np.ndarray, max_extra: float, ref_contention: int, ref_servers: int,
               params: CommParams) -> tuple[np.ndarray, np.ndarray]:
    """Gradient size and compute time per job such that the one-server iteration takes ``tau1`` and, split over
    ``ref_servers`` servers with ``ref_contention`` contending jobs, ``max_extra`` longer."""
    w = gpus.astype(float)
    frac = np.where(w > 1, (w - 1.0) / w, 0.0)
    f_ref = degradation(params.xi1 * ref_contention, params.alpha)
    overhead_extra = params.xi2 * params.overhead * (ref_servers - 1)
    per_grad = 2.0 * frac * (f_ref / params.b_inter - 1.0 / params.b_intra)
    room = max_extra * tau1 - overhead_extra
    if np.any(room <= 0):
        raise BadValue("CommParams.overhead alone exceeds max_extra of the iteration time: lower it")
    grad = np.where(w > 1, room / np.where(per_grad > 0, per_grad, 1.0), 0.0)
    one_server = frac * grad * (2.0 / params.b_intra + 1.0 / params.reduce_speed) + params.xi2 * params.overhead
    compute = tau1 - one_server
    if np.any(compute <= 0):
        raise BadValue("communication alone exceeds the drawn iteration time: raise b_intra / reduce_speed")
    return grad, compute


def paper_instance(seed: int, servers: int = 20, *, mix: dict[int, int] | None = None,
                   iters: tuple[int, int] = (1000, 6000), tau: tuple[float, float] = (0.01, 0.05),
                   max_extra: float = 0.15, ref_contention: int = 4, ref_servers: int = 2,
                   server_choices: tuple[int, ...] = PAPER_SERVER_GPUS, params: CommParams | None = None) -> Instance:
    """A random instance of section 7, the calibrated reading (a sensitivity beside ``faithful_instance``):
    ``mix`` (default PAPER_MIX) in random order, ``servers`` with GPUs drawn uniformly from ``server_choices``
    ({4, 8, 16, 32}), F_j ~ U``iters`` and a one-server iteration time ~ U``tau`` slots drawn independently (so
    the contention-free time F_j tau_j spans 10-300 slots).

    Each job's gradient size is set so that, split over ``ref_servers`` servers with ``ref_contention`` jobs on
    them, its iteration takes ``max_extra`` longer than inside one server; more contention costs more (the model
    is not clipped), less costs less.
    """
    rng = np.random.default_rng(seed)
    params = params or CommParams()
    gpus, server_gpus = _draw_cluster(rng, mix or PAPER_MIX, servers, server_choices)
    n = len(gpus)
    f = rng.integers(iters[0], iters[1] + 1, size=n)
    tau1 = rng.uniform(tau[0], tau[1], size=n)
    grad, compute = _calibrate(gpus, tau1, max_extra, ref_contention, ref_servers, params)
    return Instance(server_gpus.astype(np.int64), gpus.astype(np.int64), f.astype(np.int64), grad, compute, params)


def faithful_instance(seed: int, servers: int = 20, *, mix: dict[int, int] | None = None,
                      rho: tuple[float, float] = (50.0, 300.0), iters: tuple[int, int] = (1000, 6000),
                      tau: tuple[float, float] = (0.01, 0.05), cap: float = 0.15, ref_contention: int = 4,
                      ref_servers: int = 2, server_choices: tuple[int, ...] = PAPER_SERVER_GPUS,
                      params: CommParams | None = None) -> Instance:
    """A random instance of section 7 as the paper states it: the estimated execution time rho-hat_j = tau_j F_j
    ~ U``rho`` ([50, 300] slots), with tau_j in ``tau`` and F_j in ``iters`` consistent with it (tau_j drawn
    uniformly from the part of ``tau`` that keeps F_j = rho-hat_j / tau_j in ``iters``), and contention plus
    overhead capped at ``cap`` (15%) of the contention-free (one-server) time (``CommParams.max_extra``).

    Below the cap the model is calibrated as in ``paper_instance``: split over ``ref_servers`` servers with
    ``ref_contention`` contending jobs a job's iteration takes ``cap`` longer; more contention is clipped at
    the cap, less costs less. The slotted time F_j / floor(1 / tau_j) is up to 5% above rho-hat_j.
    """
    if not (0 < tau[0] <= tau[1] and tau[0] * iters[0] <= rho[0] <= rho[1] <= tau[1] * iters[1]):
        raise BadValue(f"rho-hat {rho} cannot be tau {tau} x F {iters} for every draw")
    rng = np.random.default_rng(seed)
    params = replace(params or CommParams(), max_extra=cap)
    gpus, server_gpus = _draw_cluster(rng, mix or PAPER_MIX, servers, server_choices)
    n = len(gpus)
    rho_hat = rng.uniform(rho[0], rho[1], size=n)
    lo = np.maximum(tau[0], rho_hat / iters[1])
    hi = np.minimum(tau[1], rho_hat / iters[0])
    tau1 = rng.uniform(lo, hi)
    f = np.clip(np.rint(rho_hat / tau1), iters[0], iters[1])
    grad, compute = _calibrate(gpus, tau1, cap, ref_contention, ref_servers, params)
    return Instance(server_gpus.astype(np.int64), gpus.astype(np.int64), f.astype(np.int64), grad, compute, params)


def binding_instance(seed: int, *, servers: int = 3, jobs: int = 6, server_choices: tuple[int, ...] = (4, 8),
                     max_gpus: int = 16, sizes: tuple[int, ...] = (1, 2, 4, 8), iters: tuple[int, int] = (2, 5),
                     tau: tuple[float, float] = (0.2, 0.5), cap: float | None = 0.15,
                     params: CommParams | None = None) -> Instance:
    """A small instance on which contention binds, for the exact MILP: ``servers`` servers of 4/8 GPUs (at
    most ``max_gpus`` in all, which keeps the MILP small enough to be solved to optimality in seconds) and
    ``jobs`` jobs of ``sizes`` GPUs, one of them as large as the largest size and together asking for more
    than 1.5x the cluster's GPUs (so jobs queue, and spreading a job to start it sooner costs contention);
    F_j ~ U``iters``, one-server iteration time ~ U``tau``; calibrated and capped as ``faithful_instance``
    (``cap`` None: the calibrated reading, not clipped)."""
    rng = np.random.default_rng(seed)
    params = replace(params or CommParams(), max_extra=cap)
    server_gpus = rng.choice(server_choices, size=servers)
    while server_gpus.sum() > max_gpus:
        server_gpus = rng.choice(server_choices, size=servers)
    server_gpus = np.sort(server_gpus)[::-1]      # identical servers side by side (the MILP breaks their symmetry)
    while True:
        gpus = np.concatenate([[max(sizes)], rng.choice(sizes, size=jobs - 1)])
        if gpus.sum() > 1.5 * server_gpus.sum():
            break
    gpus = rng.permutation(gpus)
    f = rng.integers(iters[0], iters[1] + 1, size=jobs)
    tau1 = rng.uniform(tau[0], tau[1], size=jobs)
    grad, compute = _calibrate(gpus, tau1, 0.15 if cap is None else cap, 4, 2, params)
    return Instance(server_gpus.astype(np.int64), gpus.astype(np.int64), f.astype(np.int64), grad, compute, params)
