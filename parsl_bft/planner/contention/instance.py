"""The paper's offline, slotted setting: servers with identical GPUs, ring-all-reduce jobs all present at t = 0,
and the random instances of its evaluation (section 7)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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

    def __post_init__(self) -> None:
        n = len(self.gpus)
        for name in ("iters", "grad", "compute"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Instance.{name} has {len(getattr(self, name))} entries for {n} jobs")
        if len(self.server_gpus) == 0 or np.any(np.asarray(self.server_gpus) < 1):
            raise ValueError(f"Instance.server_gpus must be >= 1 each, got {list(self.server_gpus)}")
        if np.any(np.asarray(self.gpus) < 1) or np.any(np.asarray(self.gpus) > np.sum(self.server_gpus)):
            raise ValueError(f"job sizes must be in 1..{int(np.sum(self.server_gpus))} GPUs, got "
                             f"{sorted(set(np.asarray(self.gpus).tolist()))}")
        if np.any(np.asarray(self.iters) < 1):
            raise ValueError("every job needs >= 1 iteration")
        server_of = np.repeat(np.arange(len(self.server_gpus)), self.server_gpus)
        object.__setattr__(self, "server_of", server_of)

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
        tau = iteration_time(self.gpus[j], servers, p, self.grad[j], self.compute[j], self.params)
        return int(-(-int(self.iters[j]) // int(iterations_per_slot(tau))))

    def min_servers(self, j: int) -> int:
        """Fewest servers that can hold job j (largest servers first)."""
        return int(np.searchsorted(np.cumsum(np.sort(self.server_gpus)[::-1]), self.gpus[j]) + 1)


def paper_instance(seed: int, servers: int = 20, *, mix: dict[int, int] | None = None,
                   iters: tuple[int, int] = (1000, 6000), tau: tuple[float, float] = (0.01, 0.05),
                   max_extra: float = 0.15, ref_contention: int = 4, ref_servers: int = 2,
                   server_choices: tuple[int, ...] = PAPER_SERVER_GPUS, params: CommParams | None = None) -> Instance:
    """A random instance of section 7: ``mix`` (default PAPER_MIX) in random order, ``servers`` with GPUs drawn
    uniformly from ``server_choices`` ({4, 8, 16, 32}), F_j ~ U``iters``, a one-server iteration time ~ U``tau`` slots.

    The paper says only that contention and overhead add at most 15% of the execution time. Our reading: each
    job's gradient size is set so that, split over ``ref_servers`` servers with ``ref_contention`` jobs on
    them, its iteration takes ``max_extra`` longer than inside one server; more contention costs more (the model
    is not clipped), less costs less.
    """
    rng = np.random.default_rng(seed)
    params = params or CommParams()
    mix = mix or PAPER_MIX
    gpus = rng.permutation(np.repeat(list(mix), list(mix.values())))
    n = len(gpus)
    server_gpus = rng.choice(server_choices, size=servers)
    while server_gpus.sum() < gpus.max():
        server_gpus = rng.choice(server_choices, size=servers)
    f = rng.integers(iters[0], iters[1] + 1, size=n)
    tau1 = rng.uniform(tau[0], tau[1], size=n)
    w = gpus.astype(float)
    frac = np.where(w > 1, (w - 1.0) / w, 0.0)
    f_ref = degradation(params.xi1 * ref_contention, params.alpha)
    overhead_extra = params.xi2 * params.overhead * (ref_servers - 1)
    per_grad = 2.0 * frac * (f_ref / params.b_inter - 1.0 / params.b_intra)
    room = max_extra * tau1 - overhead_extra
    if np.any(room <= 0):
        raise ValueError("CommParams.overhead alone exceeds max_extra of the iteration time: lower it")
    grad = np.where(w > 1, room / np.where(per_grad > 0, per_grad, 1.0), 0.0)
    one_server = frac * grad * (2.0 / params.b_intra + 1.0 / params.reduce_speed) + params.xi2 * params.overhead
    compute = tau1 - one_server
    if np.any(compute <= 0):
        raise ValueError("communication alone exceeds the drawn iteration time: raise b_intra / reduce_speed")
    return Instance(server_gpus.astype(np.int64), gpus.astype(np.int64), f.astype(np.int64), grad, compute, params)
