"""Solvers of the size-choice problem: the MILP (PuLP with HiGHS or CBC), an exact DP, and two baselines."""
from __future__ import annotations

import contextlib
import heapq
import os
import sys
from collections.abc import Iterator

import numpy as np
import pulp

from ..errors import BadValue
from .problem import SizeProblem

SMALL = 20_000           # capacity x sizes below which the reference DP is quickest
CORE_TRY = 1e-5          # first core: sizes within this fraction of the bound of their job's priced choice


def solve_dp(p: SizeProblem) -> tuple[dict[str, int], str]:
    """Exact: the same objective as the MILP and ``solve_dp_reference``, fast where values are near concave.

    - When every job can have its best size at once the jobs do not interact: each takes it, O(J * K).
    - Small problems (capacity x sizes < SMALL) go to the reference DP, which has the least fixed overhead.
    - Else a Lagrangian core (``_solve_core``): a price per node splits the problem into one choice per job and
      bounds how far from its priced choice any better plan can put a job; the exact DP runs on that core only.
      Concave speedup curves with a rescale step at the current size make the core a few sizes per job; when
      concavity fails the core grows, up to the whole problem (``_solve_window``) - exact either way.
    """
    sizes = _separate(p)
    if sizes is None:
        sizes = solve_dp_reference(p)[0] if _small(p) else _solve_core(p)
    return sizes, "optimal"


def _separate(p: SizeProblem) -> dict[str, int] | None:
    """Every job at its own best size, when they all fit at once (then the jobs do not interact)."""
    best = [int(a[int(np.argmax(v))]) for a, v in zip(p.allowed, p.value)]
    return dict(zip(p.names, best)) if sum(best) <= p.capacity else None


def _small(p: SizeProblem) -> bool:
    return p.capacity * max(len(a) for a in p.allowed) < SMALL


def _solve_core(p: SizeProblem) -> dict[str, int]:
    """Price nodes at lam, the multiplier of the capacity constraint: L(lam) = sum_j max_k (v_j(k) - lam k)
    + lam * capacity bounds every plan (UB = min over lam). A plan's loss is the sum over jobs of
    d_j(k_j) = max_k (v_j(k) - lam k) - (v_j(k_j) - lam k_j) >= 0 and its value is at most UB - loss, so a plan
    better than a known one (value LB) has every d_j(k_j) <= UB - LB: only those sizes (the core) need the DP.
    A first, narrow core (d <= CORE_TRY * |UB|) usually holds the optimum already: its DP value LB proves it
    when UB - LB <= the width; else the core widened to UB - LB is exact by the argument above."""
    J = len(p.names)
    K = max(len(a) for a in p.allowed)
    A = np.zeros((J, K), dtype=np.int64)
    V = np.full((J, K), -np.inf)
    for j, (a, v) in enumerate(zip(p.allowed, p.value)):
        A[j] = a[0]                             # padding: a real size, at value -inf
        A[j, :len(a)] = a
        V[j, :len(a)] = v
    rows = np.arange(J)
    cap = p.capacity
    if int(A.min(axis=1).sum()) > cap:          # nothing fits: the reference DP's (infeasible) answer
        return _solve_window(p)

    def priced(lam: float) -> tuple[np.ndarray, float]:
        pick = (V - lam * A).argmax(axis=1)
        return pick, float((V[rows, pick] - lam * A[rows, pick]).sum()) + lam * cap

    # bisection for the price where the priced sizes cross capacity; lam_hi always fits
    lo, hi = 0.0, float(np.max(V.max(axis=1) - V[rows, A.argmin(axis=1)])) + 1.0
    ub, lam = priced(hi)[1], hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        pick, val = priced(mid)
        if val < ub:
            ub, lam = val, mid
        if A[rows, pick].sum() > cap:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    fits = priced(hi)[0]                      # a plan that fits: every core keeps it (the DP stays feasible)
    M = V - lam * A
    loss = M.max(axis=1)[:, None] - M
    tol = 1e-9 * max(1.0, abs(ub))
    width = CORE_TRY * max(1.0, abs(ub))
    for _ in range(2):                          # the second core contains every better plan: no third
        core = loss <= width + tol
        core[rows, fits] = True
        sizes, value = _solve_on(p, A, V, core)
        if ub - value <= width + tol:
            break
        width = ub - value
    return sizes


def _solve_on(p: SizeProblem, A: np.ndarray, V: np.ndarray, core: np.ndarray) -> tuple[dict[str, int], float]:
    """Exact DP restricted to the core sizes: jobs with one core size are fixed; the others choose their size
    above their smallest core size from what the fixed ones and those minimums leave."""
    rows = np.arange(len(p.names))
    cols = core.argmax(axis=1)                   # the one core size of a fixed job
    active = np.flatnonzero(core.sum(axis=1) > 1)
    if len(active):
        fixed = np.ones(len(rows), dtype=bool)
        fixed[active] = False
        left = p.capacity - int(A[rows[fixed], cols[fixed]].sum())
        choices, allowed, value = [], [], []
        for j in active:
            c = np.flatnonzero(core[j])
            a = A[j, c]
            left -= int(a.min())
            choices.append(c)
            allowed.append(a - a.min())
            value.append(V[j, c])
        sub = SizeProblem([str(j) for j in active], allowed, value, left)
        picked = _separate(sub)
        if picked is None:
            picked = solve_dp_reference(sub)[0] if _small(sub) else _solve_window(sub)
        for j, c, a, name in zip(active, choices, allowed, sub.names):
            cols[j] = c[int(np.flatnonzero(a == picked[name])[0])]
    sizes = A[rows, cols]
    return dict(zip(p.names, sizes.tolist())), float(V[rows, cols].sum())


def _solve_window(p: SizeProblem) -> dict[str, int]:
    """The full exact DP over capacity, the reference DP's answers and tie-breaks, faster on large pools:
    f_j(c) = best value of the first j jobs on at most c nodes is computed only up to the nodes those jobs can
    use (sum of their max sizes); beyond, it is flat. Candidates f(c - a_i) + v_i come from one strided window
    view of f (no index arrays, no masks), the argmax is kept as a small integer."""
    J = len(p.names)
    tops = [int(a.max()) for a in p.allowed]
    cap = p.capacity
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
    return {n: sizes[n] for n in p.names}


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
    obj: list[tuple[pulp.LpVariable, float]] = []
    cap_terms: list[tuple[pulp.LpVariable, int]] = []
    zs: list[list[pulp.LpVariable]] = []
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
        raise BadValue(f"unknown MILP solver {solver!r}: use highs or cbc")
    with _banner_to_stderr(solver == "highs"):
        prob.solve(s)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise RuntimeError(f"MILP gave no usable solution: {pulp.LpStatus[prob.status]}")
    sizes = {}
    for name, a, z in zip(p.names, p.allowed, zs):
        vals = [zi.value() or 0.0 for zi in z]
        sizes[name] = int(a[int(np.argmax(vals))])
    return sizes, ("optimal" if prob.sol_status == pulp.LpSolutionOptimal else "feasible")


_banner_shown = False


@contextlib.contextmanager
def _banner_to_stderr(highs: bool) -> Iterator[None]:
    """HiGHS writes its banner ('Running HiGHS ...') to the process's stdout at its first solve, whatever
    ``msg`` says: there it would mix into a command's output (`simulate ... > report.txt`). Send that one to
    stderr."""
    global _banner_shown
    if not highs or _banner_shown:
        yield
        return
    _banner_shown = True
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


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
