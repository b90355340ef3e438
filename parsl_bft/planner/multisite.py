"""Several sites at once: a job runs at ONE site at a time (its ranks need one interconnect), each site has its
own pool. Node ids are ``site:node``.

The exact problem is a multiple-choice knapsack with one capacity per site: binary x[j,s,k] = job j runs on k
nodes at site s, at most one option per job, sum_j k x[j,s,k] <= capacity_s (a MILP, PuLP). Values come from
the single-site model at each site's capacity; running at another site than now costs the job what stopping
costs (t_down) plus ``move_s`` seconds of its current rate for staging the checkpoint there.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pulp

from .objectives import Objective
from .placement import place
from .planner import Planner, build_problem
from .problem import JobState, Plan, site_of


@dataclass
class MultiSitePlanner:
    """``planner`` supplies the objective, t_fwd, placement and MILP solver; ``move_s``: staging seconds."""

    planner: Planner
    move_s: float = 30.0

    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0,
             remaining: dict[str, float] | None = None) -> Plan:
        """One plan over every site's pool: each job at one site (or none), moving only when it pays."""
        t0 = time.perf_counter()
        p = self.planner
        objective = p.objective
        assert isinstance(objective, Objective)       # the Planner made one in its __post_init__
        sites = sorted({site_of(n) for n in pool})
        by_site = {s: [n for n in pool if site_of(n) == s] for s in sites}
        where = {j.name: site_of(j.nodes[0]) if j.nodes else None for j in jobs}

        def at(s: str, js: list[JobState]) -> list[JobState]:
            """The jobs as site s sees them: holding their nodes there, nothing elsewhere."""
            return [replace(j, nodes=j.nodes if where[j.name] == s else ()) for j in js]
        # utility at the current size: what stopping (t_down) and moving (+ move_s) cost per second
        u_now = [float(objective.utility(j, np.array([j.size]), now)[0]) if j.size else 0.0 for j in jobs]
        options: list[list[tuple[str, int, float]]] = [[] for _ in jobs]     # per job: (site, k, value)
        for s in sites:
            prob = build_problem(at(s, jobs), len(by_site[s]), objective, p.t_fwd, now)
            for i, (j, a, v) in enumerate(zip(jobs, prob.allowed, prob.value)):
                leave = (j.spec.t_down + self.move_s) * u_now[i] if where[j.name] not in (None, s) else 0.0
                options[i] += [(s, int(k), float(val) - leave) for k, val in zip(a, v) if k > 0]
        for i, j in enumerate(jobs):     # size 0: stopping costs t_down, waiting costs nothing
            options[i].append(("", 0, -j.spec.t_down * u_now[i]))
        choice, status = _solve(options, {s: len(by_site[s]) for s in sites}, p.solver, p.time_limit)
        alloc: dict[str, tuple[str, ...]] = {}
        for s in sites:
            here = [i for i, j in enumerate(jobs) if choice[i][0] == s or where[j.name] == s]
            local = at(s, [jobs[i] for i in here])
            sizes = {jobs[i].name: choice[i][1] if choice[i][0] == s else 0 for i in here}
            for name, nodes in place(local, sizes, by_site[s], p.placement).items():
                if nodes or name not in alloc:
                    alloc[name] = nodes
        for j in jobs:
            alloc.setdefault(j.name, ())
        sizes = {j.name: len(alloc[j.name]) for j in jobs}
        rates = {j.name: j.curve.rate(sizes[j.name]) for j in jobs}
        costs = {j.name: 0.0 if sizes[j.name] == j.size and site_of((alloc[j.name] or ("",))[0]) == where[j.name]
                 else (j.spec.t_up if sizes[j.name] > j.size else j.spec.t_down) * j.curve.rate(j.size)
                 for j in jobs}
        total = sum(v for opts, c in zip(options, choice) for s, k, v in opts if (s, k) == c[:2])
        moves = [j.name for j in jobs if alloc[j.name] and where[j.name] not in (None, site_of(alloc[j.name][0]))]
        return Plan(alloc, sizes, rates, costs, total, "multisite-milp", status, time.perf_counter() - t0,
                    [f"moves {', '.join(moves)}"] if moves else [])


def _solve(options, capacity: dict[str, int], solver: str, time_limit: float):
    prob = pulp.LpProblem("bft_sites", pulp.LpMaximize)
    xs, obj = [], []
    cap: dict[str, list] = {s: [] for s in capacity}
    for i, opts in enumerate(options):
        x = [pulp.LpVariable(f"x_{i}_{o}", cat=pulp.LpBinary) for o in range(len(opts))]
        xs.append(x)
        prob += pulp.lpSum(x) == 1, f"one_option_{i}"
        for xo, (s, k, v) in zip(x, opts):
            obj.append((xo, v))
            if k:
                cap[s].append((xo, k))
    for s, terms in cap.items():
        prob += pulp.LpAffineExpression(terms) <= capacity[s], f"capacity_{s}"
    prob.setObjective(pulp.LpAffineExpression(obj))
    prob.solve(pulp.HiGHS(msg=False, timeLimit=time_limit) if solver == "highs"
               else pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit))
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise RuntimeError(f"multi-site MILP gave no usable solution: {pulp.LpStatus[prob.status]}")
    choice = [opts[int(np.argmax([xo.value() or 0.0 for xo in x]))] for x, opts in zip(xs, options)]
    return choice, "optimal" if prob.sol_status == pulp.LpSolutionOptimal else "feasible"


__all__ = ["MultiSitePlanner", "site_of"]
