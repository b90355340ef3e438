"""The exact optimum of small instances: a time-indexed MILP (PuLP; HiGHS, else CBC) of the slotted model.

Per job j, placement option o (GPUs per server, y_os; GPUs of a server are interchangeable, and jobs on a server
are intervals, so counts per slot are enough to map back to GPU ids) and slot t:
- x[j,o,t] = 1 while j runs with o, s[j,o,t] = 1 where it starts; one start per job; a running job started
  with the same option and runs without a break (no preemption, no migration);
- capacity: sum_jo y_os x[j,o,t] <= O_s;
- contention (eq. 6), exactly: c[s,t] = the split jobs running on s; w[s,t,q] = 1 when c[s,t] >= q; a job split
  on s does at most ips_jo(q) iterations in a slot where w[s,t,q] = 1 (ips_jo(p): floor(1 / tau) from eq. 8);
- progress: sum of iterations >= F_j; makespan C >= (t + 1) x[j,o,t]; minimise C.
Any schedule the engine runs is a solution, so the optimum is a lower bound on every policy's makespan (and
it is reached: the solution itself is a schedule of the model, start slots and all). The returned ``Schedule``
replayed by the engine may start a job sooner than the solution did (the engine starts jobs as soon as their
GPUs are free), which can cost others contention: compare policies with ``makespan``. Size grows with
jobs x options x horizon: meant for a handful of jobs over a few tens of slots.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .engine import Schedule
from .instance import Instance
from .model import iteration_time, iterations_per_slot


@dataclass
class MilpResult:
    """The optimal (or best found) makespan, the solver's status and the schedule that reaches it."""

    makespan: int
    status: str
    schedule: Schedule


def options(inst: Instance, j: int) -> list[tuple[int, ...]]:
    """Every way to spread job j's G_j GPUs over the servers."""
    g = int(inst.gpus[j])
    ranges = [range(min(g, int(o)) + 1) for o in inst.server_gpus]
    return [y for y in itertools.product(*ranges) if sum(y) == g]


def solve_optimal(inst: Instance, horizon: int, *, time_limit: float = 60.0) -> MilpResult:
    """Minimum makespan over all schedules that end by ``horizon`` (give a heuristic's makespan). Raises
    RuntimeError unless the solver proves it optimal within ``time_limit`` seconds."""
    import pulp

    S, J, H = inst.n_servers, inst.n_jobs, int(horizon)
    opts = [options(inst, j) for j in range(J)]
    split_on = {(j, i): [s for s, c in enumerate(y) if 0 < c < inst.gpus[j]] for j in range(J)
                for i, y in enumerate(opts[j])}
    splitters = sum(any(split_on[j, i] for i in range(len(opts[j]))) for j in range(J))
    ips = {}
    for j in range(J):
        for i, y in enumerate(opts[j]):
            spans = sum(c > 0 for c in y)
            ps = np.arange(0, splitters + 1) if split_on[j, i] else np.zeros(1)
            ips[j, i] = iterations_per_slot(iteration_time(inst.gpus[j], spans, ps, inst.grad[j], inst.compute[j],
                                                           inst.params)).tolist()
    # a start that cannot finish by the horizon even at the option's best rate is not created
    best = {k: v[min(1, len(v) - 1)] for k, v in ips.items()}       # alone on its links
    dmin = {k: -(-int(inst.iters[k[0]]) // v) for k, v in best.items()}
    m = pulp.LpProblem("ring_jobs", pulp.LpMinimize)
    X = {(j, i, t): pulp.LpVariable(f"x_{j}_{i}_{t}", cat="Binary")
         for j in range(J) for i in range(len(opts[j])) for t in range(H)}
    St = {(j, i, t): pulp.LpVariable(f"s_{j}_{i}_{t}", cat="Binary")
          for j in range(J) for i in range(len(opts[j])) for t in range(H - dmin[j, i] + 1)}
    R = {k: pulp.LpVariable(f"r_{k[0]}_{k[1]}_{k[2]}", lowBound=0) for k in X}
    C = pulp.LpVariable("makespan", lowBound=0)
    m += C
    zero = pulp.lpSum([])
    for j in range(J):
        m += pulp.lpSum(St[k] for k in St if k[0] == j) == 1
        m += pulp.lpSum(R[j, i, t] for i in range(len(opts[j])) for t in range(H)) >= int(inst.iters[j])
        m += pulp.lpSum(X[j, i, t] * best[j, i] for i in range(len(opts[j])) for t in range(H)) \
            >= int(inst.iters[j])                 # valid cut: it runs long enough at its best rate
        for i in range(len(opts[j])):
            for t in range(H):
                start = St.get((j, i, t), zero)
                # running at t without starting then: running at t-1 too (so never before its one start)
                m += X[j, i, t] - start <= (X[j, i, t - 1] if t else 0)
                if (j, i, t) in St:
                    m += St[j, i, t] <= X[j, i, t]
                m += R[j, i, t] <= best[j, i] * X[j, i, t]
                m += C >= (t + 1) * X[j, i, t]       # noqa: SIM300 (C is the makespan variable)
    for s in range(S):
        for t in range(H):
            m += pulp.lpSum(opts[j][i][s] * X[j, i, t] for j in range(J) for i in range(len(opts[j]))) \
                <= int(inst.server_gpus[s])
    _cuts(pulp, m, inst, opts, X, C)
    if splitters > 1:
        _contention(pulp, m, inst, split_on, ips, X, R, splitters, H)
    solver = _solver(pulp, time_limit)
    m.solve(solver)
    status = pulp.LpStatus[m.status]
    if status == "Optimal" and m.sol_status != pulp.LpSolutionOptimal:
        status = "Not proven optimal"           # a time limit: PuLP reports HiGHS's incumbent as "Optimal"
    if status != "Optimal":
        raise RuntimeError(f"MILP for {J} jobs / {S} servers / {H} slots: {status} (horizon too short?)")
    return MilpResult(round(C.value()), status.lower(), _to_schedule(inst, opts, X, St, H))


def _cuts(pulp, m, inst: Instance, opts, X, C) -> None:
    """Valid cuts: the GPU-slots used fit under the makespan; identical servers are interchangeable, so keep only
    the solutions that load them in non-increasing order."""
    m += pulp.lpSum(int(inst.gpus[k[0]]) * v for k, v in X.items()) <= inst.n_gpus * C
    for s in range(inst.n_servers - 1):
        if inst.server_gpus[s] == inst.server_gpus[s + 1]:
            m += pulp.lpSum(opts[j][i][s] * v for (j, i, t), v in X.items()) \
                >= pulp.lpSum(opts[j][i][s + 1] * v for (j, i, t), v in X.items())


def _contention(pulp, m, inst: Instance, split_on, ips, X, R, splitters: int, H: int) -> None:
    """Eq. 6 per server and slot: w[s,t,q] = 1 when >= q split jobs run on s; a job split on s then does at most
    ips(q) iterations. Only the q at which some job's rate drops get a w (between them the rate is flat)."""
    for s in range(inst.n_servers):
        on = [(j, i) for (j, i), ss in split_on.items() if s in ss]
        if len(on) < 2:
            continue
        levels = [q for q in range(2, min(splitters, len(on)) + 1) if any(ips[k][q] < ips[k][q - 1] for k in on)]
        for t in range(H):
            count = pulp.lpSum(X[j, i, t] for j, i in on)
            for q in levels:
                w = pulp.LpVariable(f"w_{s}_{t}_{q}", cat="Binary")
                m += count - (q - 1) <= (len(on) - q + 1) * w
                for j, i in on:
                    cap = ips[j, i]
                    if cap[q] < cap[1]:
                        m += R[j, i, t] <= cap[q] + (cap[1] - cap[q]) * (1 - w)


def _solver(pulp, time_limit: float):
    if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        return pulp.HiGHS(msg=False, timeLimit=time_limit)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit)


def _to_schedule(inst: Instance, opts, X, St, H) -> Schedule:
    """GPU ids from the counts: per server, jobs by start slot take the GPUs that are free then."""
    starts = {}
    for (j, i, t), v in St.items():
        if v.value() > 0.5:
            starts[j] = (t, i)
    ends = {j: 1 + max(t for (jj, i, t), v in X.items() if jj == j and v.value() > 0.5) for j in starts}
    order = sorted(starts, key=lambda j: (starts[j][0], j))
    base = np.concatenate([[0], np.cumsum(inst.server_gpus)[:-1]])
    free_at = [np.zeros(int(o)) for o in inst.server_gpus]
    gpus: list[np.ndarray] = [np.empty(0, np.int64)] * inst.n_jobs
    for j in order:
        t, i = starts[j]
        picked = []
        for s, c in enumerate(opts[j][i]):
            if c:
                idle = np.flatnonzero(free_at[s] <= t)[:c]
                free_at[s][idle] = ends[j]
                picked += (base[s] + idle).tolist()
        gpus[j] = np.array(picked, dtype=np.int64)
    return Schedule(order, gpus)
