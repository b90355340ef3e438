"""Solvers of the size-choice problem: the MILP (PuLP with HiGHS or CBC), an exact DP, and two baselines."""
from __future__ import annotations

import heapq
import time

import numpy as np
import pulp

from .problem import SizeProblem


def solve_dp(p: SizeProblem) -> tuple[dict[str, int], str]:
    """Exact dynamic programme over capacity, the same answers (and tie-breaks) as ``solve_dp_reference``.

    - When every job can have its largest size at once (sum of max sizes <= capacity) the jobs do not interact:
      each takes its own best size, O(J * K).
    - Else f_j(c) = best value of the first j jobs on at most c nodes is computed only up to the nodes those
      jobs can use (sum of their max sizes); beyond, it is flat. Candidates f(c - a_i) + v_i come from one
      strided window view of f (no index arrays, no masks), the argmax is kept as a small integer.
    - Small problems (capacity x sizes < 200k) go to the reference DP, which has less fixed overhead.
    """
    J = len(p.names)
    tops = [int(a.max()) for a in p.allowed]
    if sum(tops) <= p.capacity:
        return {n: int(a[int(np.argmax(v))]) for n, a, v in zip(p.names, p.allowed, p.value)}, "optimal"
    cap = p.capacity
    if cap * max(len(a) for a in p.allowed) < 200_000:     # small: the plain DP has less overhead
        return solve_dp_reference(p)
    kmax = min(max(tops), cap)
    f = np.zeros(1)                                # f[c], c = 0..reach
    reach = 0
    choices: list[np.ndarray] = []
    alloweds: list[np.ndarray] = []
    for a, v, top in zip(p.allowed, p.value, tops):
        keep = a <= cap
        a, v = a[keep], v[keep]
        new_reach = min(cap, reach + top)
        # g[c] = f[min(c, reach)] for c >= 0 (f is flat beyond reach), -inf for c < 0
        g = np.empty(kmax + new_reach + 1)
        g[:kmax] = -np.inf
        g[kmax:kmax + reach + 1] = f
        g[kmax + reach + 1:] = f[-1]
        win = np.lib.stride_tricks.sliding_window_view(g, kmax + 1)    # win[c, t] = g[c + t] = f(c + t - kmax)
        cand = win[:, kmax - a] + v                                      # cand[c, i] = f(c - a_i) + v_i
        arg = cand.argmax(axis=1)                                        # first (smallest) size wins ties
        f = cand[np.arange(new_reach + 1), arg]
        choices.append(arg.astype(np.int32))
        alloweds.append(a)
        reach = new_reach
    sizes: dict[str, int] = {}
    c = reach
    for j in range(J - 1, -1, -1):
        k = int(alloweds[j][choices[j][min(c, len(choices[j]) - 1)]])
        sizes[p.names[j]] = k
        c -= k
    return {n: sizes[n] for n in p.names}, "optimal"


def solve_dp_reference(p: SizeProblem) -> tuple[dict[str, int], str]:
    """The first exact DP (kept as the reference benchmarks/planner.py times the fast one against)."""
    cap = min(p.capacity, int(sum(a.max() for a in p.allowed)))
    f = np.zeros(cap + 1)                      # best value with at most c nodes, no job yet
    cs = np.arange(cap + 1)
    choices = []
    for a, v in zip(p.allowed, p.value):
        keep = a <= cap
        a, v = a[keep], v[keep]
        src = cs[None, :] - a[:, None]            # cand[i, c] = f[c - a_i] + v_i, all sizes at once
        cand = np.where(src >= 0, f[np.maximum(src, 0)] + v[:, None], -np.inf)
        arg = cand.argmax(axis=0)                  # first (smallest) size wins ties
        f = cand[arg, cs]
        choices.append(a[arg])
    sizes: dict[str, int] = {}
    c = cap
    for name, pick in zip(reversed(p.names), reversed(choices)):
        k = int(pick[c])
        sizes[name] = k
        c -= k
    return {n: sizes[n] for n in p.names}, "optimal"


def solve_milp(p: SizeProblem, solver: str = "highs", time_limit: float = 10.0) -> tuple[dict[str, int], str]:
    """The multiple-choice knapsack as a MILP: binary z[j,i] = job j takes allowed[j][i].

    Returns status 'optimal', or 'feasible' when the time limit stopped the solver with an incumbent.
    Raises RuntimeError when there is no solution to use (the caller falls back to the DP).
    """
    prob = pulp.LpProblem("bft_sizes", pulp.LpMaximize)
    obj, cap_terms, zs = [], [], []
    for j, (a, v) in enumerate(zip(p.allowed, p.value)):
        z = [pulp.LpVariable(f"z_{j}_{i}", cat=pulp.LpBinary) for i in range(len(a))]
        zs.append(z)
        obj.extend(zip(z, v.tolist()))
        cap_terms.extend((zi, int(k)) for zi, k in zip(z, a.tolist()) if k)
        prob += pulp.LpAffineExpression([(zi, 1) for zi in z]) == 1, f"one_size_{j}"
    prob += pulp.LpAffineExpression(cap_terms) <= p.capacity, "capacity"
    prob.setObjective(pulp.LpAffineExpression(obj))
    if solver == "highs":
        s = pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=0.0, gapAbs=1e-8)   # exact, like the DP
    elif solver == "cbc":
        s = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=0.0, gapAbs=1e-8)
    else:
        raise ValueError(f"unknown MILP solver {solver!r}: use highs or cbc")
    prob.solve(s)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise RuntimeError(f"MILP gave no usable solution: {pulp.LpStatus[prob.status]}")
    sizes = {}
    for name, a, z in zip(p.names, p.allowed, zs):
        vals = [zi.value() or 0.0 for zi in z]
        sizes[name] = int(a[int(np.argmax(vals))])
    return sizes, ("optimal" if prob.sol_status == pulp.LpSolutionOptimal else "feasible")


def solve_greedy(p: SizeProblem) -> tuple[dict[str, int], str]:
    """Marginal-gain baseline: repeatedly make the step (to a job's next allowed size) with the best gain per
    node that still fits, while gains are positive."""
    idx = [0] * len(p.names)
    used = int(sum(a[0] for a in p.allowed))   # an objective may have ruled out size 0 (max-min fairness)
    heap: list[tuple[float, int]] = []

    def push(j: int) -> None:
        i = idx[j]
        a, v = p.allowed[j], p.value[j]
        if i + 1 < len(a):
            gain = float(v[i + 1] - v[i])
            if gain > 0:
                heapq.heappush(heap, (-gain / float(a[i + 1] - a[i]), j))

    for j in range(len(p.names)):
        push(j)
    while heap:
        _, j = heapq.heappop(heap)
        a = p.allowed[j]
        step = int(a[idx[j] + 1] - a[idx[j]])
        if used + step > p.capacity:
            continue
        used += step
        idx[j] += 1
        push(j)
    return {n: int(a[i]) for n, a, i in zip(p.names, p.allowed, idx)}, "heuristic"


def solve_equal_share(p: SizeProblem, order: list[int] | None = None) -> tuple[dict[str, int], str]:
    """BFTrainer's baseline: split the nodes evenly over the jobs (in submit order), within [min, max]; a job
    whose share is below its minimum waits (size 0)."""
    order = order if order is not None else list(range(len(p.names)))
    # an objective may have ruled out small sizes (max-min): set those minimums aside, share the rest
    left, sizes = p.capacity - int(sum(a[0] for a in p.allowed)), {}
    pending = list(order)
    while pending:
        share = left // len(pending)
        j = pending.pop(0)
        a = p.allowed[j]
        k = int(a[a <= a[0] + share][-1])
        sizes[p.names[j]] = k
        left -= k - int(a[0])
    return {n: sizes[n] for n in p.names}, "heuristic"


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t
