"""BFTrainer's node-level model, for cross-checks and benchmarks at small sizes.

Binary x[j,n] (node n runs job j) over the pool, binary size indicators (exact at every integer size - the
"binary segments" that replace SOS2, which PuLP's CBC ignores), grow/shrink indicators u_j, d_j with no
migration: a job only gains nodes when growing (x[j,n] <= u_j for nodes it does not hold) and only drops nodes
when shrinking (x[j,n] >= 1 - d_j for nodes it holds). Its optimum equals the size-choice problem's; it is just
much bigger (J x N binaries and node symmetry), which is what benchmarks/planner.py shows.
"""
from __future__ import annotations

import pulp

from .problem import JobState, SizeProblem


def solve_node_milp(p: SizeProblem, jobs: list[JobState], pool: list[str], solver: str = "cbc",
                    time_limit: float = 60.0) -> tuple[dict[str, tuple[str, ...]], str]:
    """BFTrainer's node-level model: a binary per (job, node), so the solver picks sizes and nodes at once (no
    node a job keeps moves). Small pools only; ``p`` gives each job's allowed sizes and their values."""
    prob = pulp.LpProblem("bft_nodes", pulp.LpMaximize)
    x = {(j, n): pulp.LpVariable(f"x_{j}_{i}", cat=pulp.LpBinary) for j in range(len(jobs)) for i, n in enumerate(pool)}
    obj: list[tuple[pulp.LpVariable, float]] = []
    for j, (job, a, v) in enumerate(zip(jobs, p.allowed, p.value)):
        lam = [pulp.LpVariable(f"l_{j}_{i}", cat=pulp.LpBinary) for i in range(len(a))]
        u = pulp.LpVariable(f"u_{j}", cat=pulp.LpBinary)
        d = pulp.LpVariable(f"d_{j}", cat=pulp.LpBinary)
        obj.extend(zip(lam, v.tolist()))
        prob += pulp.lpSum(lam) == 1
        prob += pulp.lpSum(x[j, n] for n in pool) == pulp.lpSum(int(k) * li for k, li in zip(a.tolist(), lam))
        prob += u + d <= 1
        held = set(job.nodes)
        for n in pool:
            prob += (x[j, n] >= 1 - d) if n in held else (x[j, n] <= u)
    for n in pool:
        prob += pulp.lpSum(x[j, n] for j in range(len(jobs))) <= 1
    prob += pulp.lpSum(x.values()) <= p.capacity
    prob.setObjective(pulp.LpAffineExpression(obj))
    s = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit) if solver == "cbc" else \
        pulp.HiGHS(msg=False, timeLimit=time_limit)
    prob.solve(s)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise RuntimeError(f"node-level MILP gave no usable solution: {pulp.LpStatus[prob.status]}")
    alloc = {job.name: tuple(n for n in pool if (x[j, n].value() or 0) > 0.5) for j, job in enumerate(jobs)}
    return alloc, ("optimal" if prob.sol_status == pulp.LpSolutionOptimal else "feasible")
