"""The planner: at every change, how many nodes each job gets (and which)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .objectives import Objective, make_objective
from .placement import Placement, place
from .problem import JobState, Plan, SizeProblem
from .solvers import solve_dp, solve_equal_share, solve_greedy, solve_milp

METHODS = ("milp", "dp", "greedy", "equal-share", "node-milp")


def build_problem(jobs: list[JobState], pool_size: int, objective: Objective, t_fwd: float, now: float = 0.0,
                  remaining: dict[str, float] | None = None, short_free: int = 0) -> SizeProblem:
    """Values v[j,k] = H_j * U_j(k) - rescale cost(C_j -> k), charged at the current rate U_j(C_j).

    Horizon awareness (``remaining`` = expected idle time left per node): H_j = min(T_fwd, the shortest remaining
    time among the job's nodes), and a job holding a node that leaves within T_fwd pays the expected reclaim
    t_down * U_j(k). Free nodes leaving within T_fwd (``short_free``) are not offered for growth.
    """
    capacity = pool_size - short_free
    allowed, values = [], []
    for j in jobs:
        s = j.spec
        hi = min(s.max_nodes, capacity)
        a = np.array([0] + list(range(s.min_nodes, hi + 1)), dtype=np.int64)
        if j.size and j.size not in set(a.tolist()):   # the pool shrank under a held size: keep it choosable
            a = np.unique(np.append(a, j.size))
        u = objective.utility(j, np.append(a, j.size), now)
        u_now = float(u[-1])
        u = u[:-1]
        h = t_fwd
        reclaim = np.zeros(len(a))
        if remaining:
            left = min((remaining.get(n, math.inf) for n in j.nodes), default=math.inf)
            h = min(t_fwd, left)
            if left < t_fwd:
                reclaim = s.t_down * u
        cost = np.where(a > j.size, s.t_up * u_now, np.where(a < j.size, s.t_down * u_now, 0.0))
        allowed.append(a)
        values.append(h * u - cost - reclaim)
    narrowed = objective.restrict(jobs, allowed, capacity)
    values = [v[np.isin(a, b)] for v, a, b in zip(values, allowed, narrowed)]
    return SizeProblem([j.name for j in jobs], narrowed, values, capacity)


@dataclass
class Planner:
    """``method``: milp (PuLP; ``solver`` highs or cbc) | dp (exact) | greedy | equal-share | node-milp
    (BFTrainer's node-level model, small sizes only). On a MILP time-out the best feasible solution is used,
    else the exact DP - never the old map with new nodes left idle."""

    method: str = "milp"
    solver: str = "highs"
    objective: Objective | str = "speedup"
    t_fwd: float = 10.0
    time_limit: float = 10.0
    horizon_aware: bool = False
    placement: Placement = field(default_factory=Placement)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown planner method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.t_fwd <= 0:
            raise ValueError(f"t_fwd must be > 0, got {self.t_fwd}")
        self.objective = make_objective(self.objective)

    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0,
             remaining: dict[str, float] | None = None) -> Plan:
        t0 = time.perf_counter()
        pool_set = set(pool)
        for j in jobs:
            stray = [n for n in j.nodes if n not in pool_set]
            if stray:
                raise ValueError(f"job {j.name} holds nodes outside the idle pool: {stray[:3]} (remove reclaimed "
                                 "nodes before planning)")
        rem = remaining if self.horizon_aware else None
        held = {n for j in jobs for n in j.nodes}
        short_free = sum(1 for n in pool if n not in held and rem and rem.get(n, math.inf) < self.t_fwd)
        prob = build_problem(jobs, len(pool), self.objective, self.t_fwd, now, rem, short_free)
        notes: list[str] = []
        alloc = None
        if self.method == "milp":
            try:
                sizes, status = solve_milp(prob, self.solver, self.time_limit)
            except RuntimeError as e:
                notes.append(f"{e}; fell back to the exact DP")
                sizes, _ = solve_dp(prob)
                status = "fallback-dp"
        elif self.method == "dp":
            sizes, status = solve_dp(prob)
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
        if alloc is None:
            alloc = place(jobs, sizes, pool, self.placement, rem)
        rates, costs = {}, {}
        for j in jobs:
            k = sizes[j.name]
            rates[j.name] = j.curve.rate(k)
            now_rate = j.curve.rate(j.size)
            costs[j.name] = (j.spec.t_up if k > j.size else j.spec.t_down if k < j.size else 0.0) * now_rate
        return Plan(alloc, sizes, rates, costs, prob.objective(sizes), self.method, status,
                    time.perf_counter() - t0, notes)
