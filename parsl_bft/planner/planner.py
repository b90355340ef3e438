"""The planner: at every change, how many nodes each job gets (and which)."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BadValue
from .cohorts import CohortHazard, Cohorts
from .freeze import best_levels
from .methods import HORIZON_MODELS, METHODS, SOLVERS, HorizonModel, PlannerMethod, Solver
from .objectives import Objective, make_objective
from .placement import Placement, place
from .problem import JobState, Plan, SizeProblem
from .solvers import solve_dp, solve_equal_share, solve_greedy, solve_milp

if TYPE_CHECKING:
    from .netcost import NetworkCost

# a topology's predicted network factor per size of a job (``netcost.size_factors``)
NetFactor = Callable[[JobState, np.ndarray], np.ndarray]


def build_problem(jobs: list[JobState], pool_size: int, objective: Objective, t_fwd: float, now: float = 0.0,
                  remaining: dict[str, float] | None = None, free_remaining: np.ndarray | None = None,
                  net_factor: NetFactor | None = None, horizon_model: HorizonModel = "hazard",
                  levels: dict[str, dict[int, int]] | None = None, free_cohorts: list[float] | None = None,
                  cohorts: dict[str, float] | None = None) -> SizeProblem:
    """Values v[j,k] = gain of running at size k over the horizon - rescale cost(C_j -> k) at the current rate.

    Without horizon information the gain is T_fwd * U_j(k) (BFTrainer). With it (``remaining``: expected idle
    time left per node; ``free_remaining``: the same for the nodes a growing job would get, in order) a job of
    size k keeps its k longest-lived nodes (growing: its own plus the longest-lived free ones); with their
    remaining times r_1 >= ... >= r_k cut at T_fwd, it runs at size m while m nodes are left:
    gain = sum_m min(r_m, T) * (U(m) - U(m-1)), and each node leaving before T costs t_down * U(m).
    That is ``horizon_model="cut"``. The default, ``"hazard"``, charges the reclaims that growing adds: growing
    to size k onto new nodes is worth T_fwd * U(k) * (1 - t_down * h), h the expected reclaims within T_fwd
    per second (``cohorts.CohortHazard``: one per new cohort - ``free_cohorts``, the free nodes' cohorts;
    ``cohorts``, node -> cohort for the held ones - with probability 1 - exp(-T_fwd / r)). A cohort about
    to leave is worth less the bigger the job it would join. The job's own nodes carry no such term: their
    reclaim costs the same pause as giving them up now (sunk).
    ``net_factor(job, sizes)`` (a topology's predicted slowdown per size, ``netcost.size_factors``) scales the
    gain: a size that must spread over contended groups is worth less.
    Layer elasticity: a job that may be frozen (``JobState.layers`` set, ``spec.freeze`` "auto") is valued at
    each size with its best allowed freeze level (``freeze.best_levels``: the utility times
    P(n, f) (1 - penalty(f)) / P(n, 0)); changing level at the same size costs a restart (t_up). The levels
    chosen go to ``levels`` (job -> one level per allowed size), so the size problem keeps one value per
    (job, size) and every solver stays exact for the joint choice.
    """
    hazard = CohortHazard(free_remaining, free_cohorts, t_fwd) \
        if remaining is not None and horizon_model == "hazard" else None
    horizon = _Horizon(t_fwd, remaining, free_remaining, horizon_model, hazard, cohorts, net_factor)
    allowed, values = [], []
    for j in jobs:
        a, value, level = _job_values(j, pool_size, objective, now, horizon)
        allowed.append(a)
        values.append(value)
        if levels is not None:
            levels[j.name] = dict(zip(a.tolist(), level.tolist()))
    narrowed = objective.restrict(jobs, allowed, pool_size)
    values = [v if b is a else v[np.isin(a, b)] for v, a, b in zip(values, allowed, narrowed)]   # most keep all
    return SizeProblem([j.name for j in jobs], narrowed, values, pool_size)


@dataclass
class _Horizon:
    """What values a size beyond the job's own utility: the idle time known to be left, the reclaim hazard
    and the network (``build_problem``'s docstring says how each counts)."""

    t_fwd: float
    remaining: dict[str, float] | None
    free_remaining: np.ndarray | None
    model: HorizonModel
    hazard: CohortHazard | None
    cohorts: dict[str, float] | None
    net_factor: NetFactor | None

    def gain(self, j: JobState, a: np.ndarray, u_all: np.ndarray) -> np.ndarray:
        """The gain of each size in ``a`` for job ``j``, utility ``u_all`` per size."""
        u = u_all[a]
        s = j.spec
        if self.remaining is None:
            gain = self.t_fwd * u
        elif self.model == "hazard":
            assert self.hazard is not None      # built whenever remaining times are known
            own = {(self.cohorts or {}).get(n, n) for n in j.nodes}
            gain = self.t_fwd * u * (1.0 - s.t_down * self.hazard(own, j.size, a))
        else:
            held = np.sort([self.remaining.get(n, math.inf) for n in j.nodes])[::-1]
            gain = np.array([_horizon_gain(held, int(k), u_all, self.free_remaining, self.t_fwd, s.t_down)
                             for k in a])
        return gain * self.net_factor(j, a) if self.net_factor is not None else gain


def _job_values(j: JobState, pool_size: int, objective: Objective, now: float,
                horizon: _Horizon) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One job's allowed sizes, the value of each and the freeze level it would run at."""
    s = j.spec
    hi = min(s.max_nodes, pool_size)
    a = np.array([0, *range(s.min_nodes, hi + 1)], dtype=np.int64)
    if j.size and j.size not in set(a.tolist()):   # the pool shrank under a held size: keep it choosable
        a = np.unique(np.append(a, j.size))
    ks = np.arange(max(int(a.max()), j.size, 1) + 1)
    u_base = objective.utility(j, ks, now)
    choice = best_levels(j, ks, j.layers)
    u_now = float(u_base[j.size] * (choice.current if choice.current is not None else choice.factor)[j.size])
    cost = np.where(a > j.size, s.t_up * u_now, np.where(a < j.size, s.t_down * u_now, 0.0))
    gain, level = horizon.gain(j, a, u_base * choice.factor), choice.level[a]
    value = gain - cost
    i = int(np.flatnonzero(a == j.size)[0])
    if j.size and choice.current is not None:
        # what a new level gains lasts until the job ends, not beyond: a job about to finish is not restarted for
        # speed (at any size: a restart that costs more than the rest of the job would make it flap)
        left = min(1.0, j.remaining / max(j.rate(), 1e-12) / horizon.t_fwd)
        stay = horizon.gain(j, a, u_base * choice.current)
        moved = (level != j.freeze) & (a > 0)
        value[moved] = stay[moved] + (gain[moved] - stay[moved]) * left - cost[moved]
        # at its own size a new level means a restart too: keep the current one unless the gain pays for it
        if level[i] != j.freeze:
            if value[i] - stay[i] <= s.t_up * u_now:
                level[i], value[i] = j.freeze, stay[i]
            else:
                value[i] -= s.t_up * u_now
    elif j.size and level[i] != j.freeze:      # the budget no longer allows the current level: it must change
        value[i] -= s.t_up * u_now
    return a, value, level


def _horizon_gain(held: np.ndarray, k: int, u: np.ndarray, free_remaining: np.ndarray | None, t_fwd: float,
                  t_down: float) -> float:
    """Gain of size k for a job holding nodes with remaining idle times ``held`` (longest first)."""
    if k == 0:
        return 0.0
    if k > len(held):
        extra = free_remaining[: k - len(held)] if free_remaining is not None else np.full(k - len(held), math.inf)
        held = np.sort(np.concatenate([held, extra]))[::-1]
    r = held[:k]
    du = np.diff(u[: k + 1])                     # U(m) - U(m-1), m = 1..k
    gain = float(np.sum(np.minimum(r, t_fwd) * du))
    leaving = np.flatnonzero(r < t_fwd)          # the (m+1)-th node leaves while the job runs on m+1
    return gain - t_down * float(np.sum(u[leaving + 1]))


@dataclass
class Planner:
    """``method``: milp (PuLP; ``solver`` highs or cbc) | dp (exact) | greedy | equal-share | node-milp
    (BFTrainer's node-level model, small sizes only). On a MILP time-out the best feasible solution is used,
    else the exact DP - never the old map with new nodes left idle."""

    method: PlannerMethod = "milp"
    solver: Solver = "highs"
    objective: Objective | str = "speedup"
    t_fwd: float = 10.0
    time_limit: float = 10.0
    horizon_aware: bool = False
    horizon_model: HorizonModel = "hazard"   # how predicted remaining idle time is valued: hazard | cut
    placement: Placement = field(default_factory=Placement)
    network: NetworkCost | None = None   # values see the groups a size would span
    _cohorts: Cohorts = field(default_factory=Cohorts, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BadValue(f"unknown planner method {self.method!r}; choose from {', '.join(METHODS)}")
        if not 0 < self.t_fwd < float("inf"):
            raise BadValue(f"t_fwd must be a finite number > 0, got {self.t_fwd}")
        if not 0 < self.time_limit < float("inf"):
            raise BadValue(f"time_limit must be a finite number > 0, got {self.time_limit}")
        if self.solver not in SOLVERS:
            raise BadValue(f"unknown MILP solver {self.solver!r}: use {' or '.join(SOLVERS)}")
        if self.horizon_model not in HORIZON_MODELS:
            raise BadValue(f"unknown horizon_model {self.horizon_model!r}: use {' or '.join(HORIZON_MODELS)}")
        self.objective = make_objective(self.objective)

    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0,
             remaining: dict[str, float] | None = None) -> Plan:
        """Sizes, nodes and freeze levels for ``jobs`` over the idle ``pool`` at ``now`` (``remaining``: expected
        idle seconds left per node, used when horizon-aware and always for placement)."""
        t0 = time.perf_counter()
        pool_set = set(pool)
        for j in jobs:
            stray = [n for n in j.nodes if n not in pool_set]
            if stray:
                raise BadValue(f"job {j.name} holds nodes outside the idle pool: {stray[:3]} (remove reclaimed "
                               "nodes before planning)")
        levels: dict[str, dict[int, int]] = {}
        prob = self._problem(jobs, pool, now, remaining if self.horizon_aware else None, levels)
        notes: list[str] = []
        sizes, alloc, status = self._solve(prob, jobs, pool, notes)
        if alloc is None:
            alloc = place(jobs, sizes, pool, self.placement, remaining)   # known lifetimes: always use them
        rates, costs, freeze = {}, {}, {}
        for j in jobs:
            k = sizes[j.name]
            freeze[j.name] = levels[j.name].get(k, j.freeze) if k else j.freeze   # idle: keeps its level
            rates[j.name] = j.layers.rate(k, freeze[j.name]) if j.layers is not None else j.curve.rate(k)
            now_rate = j.rate()
            pause = j.spec.t_up if k > j.size or (k and freeze[j.name] != j.freeze) else \
                j.spec.t_down if k < j.size else 0.0
            costs[j.name] = pause * now_rate
        return Plan(alloc, sizes, rates, costs, prob.objective(sizes), self.method, status,
                    time.perf_counter() - t0, notes, freeze)

    def _problem(self, jobs: list[JobState], pool: list[str], now: float, rem: dict[str, float] | None,
                 levels: dict[str, dict[int, int]]) -> SizeProblem:
        """The size problem (the freeze level chosen per job and size goes to ``levels``)."""
        free_rem: np.ndarray | None = None
        free_coh: list[float] | None = None
        cohorts: dict[str, float] | None = None
        if rem is not None:
            cohorts = self._cohorts.update(pool, now)
            # nodes a growing job would get: the free ones longest-lived first, then those others give up
            held = {n for j in jobs for n in j.nodes}
            order = [sorted((n for n in pool if (n in held) == h), key=lambda n: -rem.get(n, math.inf))
                     for h in (False, True)]
            free_rem = np.array([rem.get(n, math.inf) for n in order[0] + order[1]])
            free_coh = [cohorts[n] for n in order[0] + order[1]]
        net_factor = None
        if self.network is not None:
            from .netcost import size_factors
            net_factor = size_factors(self.network, jobs, pool)
        assert isinstance(self.objective, Objective)       # made one in __post_init__
        return build_problem(jobs, len(pool), self.objective, self.t_fwd, now, rem, free_rem, net_factor,
                             self.horizon_model, levels, free_coh, cohorts)

    def _solve(self, prob: SizeProblem, jobs: list[JobState], pool: list[str],
               notes: list[str]) -> tuple[dict[str, int], dict[str, tuple[str, ...]] | None, str]:
        """Sizes by ``method``, the nodes too where the method picks them (node-milp), and the solve status."""
        alloc = None
        exact = prob.tie_broken()         # the MILP and the DP break exact ties the same way
        if self.method == "milp":
            try:
                sizes, status = solve_milp(exact, self.solver, self.time_limit)
            except RuntimeError as e:
                notes.append(f"{e}; fell back to the exact DP")
                sizes, _ = solve_dp(exact)
                status = "fallback-dp"
        elif self.method == "dp":
            sizes, status = solve_dp(exact)
        elif self.method == "greedy":
            sizes, status = solve_greedy(prob)
        elif self.method == "equal-share":
            order = sorted(range(len(jobs)), key=lambda i: (jobs[i].spec.submit, jobs[i].name))
            sizes, status = solve_equal_share(prob, order)
        else:
            from .nodemilp import solve_node_milp
            alloc, status = solve_node_milp(prob, jobs, pool, self.solver if self.solver == "highs" else "cbc",
                                            self.time_limit)
            sizes = {n: len(v) for n, v in alloc.items()}
        return sizes, alloc, status
