"""Planner solve times and objectives: size-choice MILP (HiGHS, CBC), exact DP, BFTrainer's node-level MILP.

Same 20 random instances per size for every method: jobs from the ImageNet mix, random current allocations.
dp-reference is the first DP (solvers.solve_dp_reference), timed in the same invocation: the dp/dp-reference
ratios compare the two on the same machine and instances. CBC is skipped at 256 x 10,624 (minutes per solve).
Prints a table, then (LAST line) one JSON object {"results": [...]}.
Usage: python benchmarks/planner.py [--instances 20] [--data ../shared/data] [--sizes 64x4734,256x10624]
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

import parsl_bft.planner.planner as planner_module
from parsl_bft.jobs import load_jobset
from parsl_bft.planner import JobState, Planner
from parsl_bft.planner.solvers import solve_dp, solve_dp_reference

SIZES = [(10, 64), (20, 100), (64, 1000), (64, 4734), (256, 10624)]
METHODS = {"milp-highs": dict(method="milp", solver="highs"), "milp-cbc": dict(method="milp", solver="cbc"),
           "dp": dict(method="dp"), "dp-reference": dict(method="dp"),
           "node-milp-cbc": dict(method="node-milp", solver="cbc")}
NODE_MILP_LIMIT_S = 60.0


def instance(js, n_jobs, n_nodes, rng):
    pool = [f"n{i:05d}" for i in range(n_nodes)]
    free = list(pool)
    rng.shuffle(free)
    jobs = []
    for spec in rng.sample(js.jobs, n_jobs):
        k = rng.choice([0, 0] + [1, 2, 4, 8, 16, 32, 64])
        k = min(k, spec.max_nodes, len(free))
        k = 0 if k < spec.min_nodes else k
        jobs.append(JobState(spec, js.curve(spec), tuple(free[:k])))
        free = free[k:]
    return jobs, pool


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--tfwd", type=float, default=10.0)
    ap.add_argument("--sizes", help="JOBSxNODES,... (default: every size above)")
    args = ap.parse_args()
    sizes = SIZES if not args.sizes else [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    js = load_jobset(Path(args.data) / "jobs" / "imagenet_mix.jobs.csv")
    Planner(method="milp").plan(*instance(js, 2, 4, random.Random(0)))   # warm imports
    results = []
    print(f"{'jobs':>4} {'nodes':>5} {'method':14} {'p50 s':>9} {'p99 s':>9} {'objective':>12} {'status'}")
    for J, N in sizes:
        rng = random.Random(1000 * J + N)
        insts = [instance(js, J, N, rng) for _ in range(args.instances)]
        per = {}
        for name, kw in METHODS.items():
            if name == "node-milp-cbc" and J * N > 20 * 100:
                print(f"{J:>4} {N:>5} {name:14} skipped: {J * N:,} x-binaries (too big to finish in "
                      f"{NODE_MILP_LIMIT_S:.0f} s)")
                continue
            if name == "milp-cbc" and J * N > 64 * 4734:
                print(f"{J:>4} {N:>5} {name:14} skipped (minutes per solve)")
                continue
            planner_module.solve_dp = solve_dp_reference if name == "dp-reference" else solve_dp
            planner = Planner(t_fwd=args.tfwd, time_limit=NODE_MILP_LIMIT_S, **kw)
            times, objs, statuses = [], [], set()
            for jobs, pool in insts:
                t = time.perf_counter()
                plan = planner.plan(jobs, pool)
                times.append(time.perf_counter() - t)
                objs.append(plan.objective)
                statuses.add(plan.status)
                if name == "node-milp-cbc" and times[-1] > NODE_MILP_LIMIT_S:
                    break
            row = {"jobs": J, "nodes": N, "method": name, "p50_s": float(np.percentile(times, 50)),
                   "p99_s": float(np.percentile(times, 99)), "objective": float(np.mean(objs)),
                   "status": sorted(statuses), "instances": len(times)}
            per[name] = row
            results.append(row)
            print(f"{J:>4} {N:>5} {name:14} {row['p50_s']:>9.4f} {row['p99_s']:>9.4f} {row['objective']:>12.2f} "
                  f"{','.join(row['status'])}")
        best = min(per.values(), key=lambda r: r["p99_s"])
        ref = per["dp"]["objective"]
        same = all(abs(r["objective"] - ref) <= 1e-6 * max(1, abs(ref)) for r in per.values()
                   if r["instances"] == args.instances)
        line = f"  -> best {best['method']} p99 {best['p99_s']:.4f} s; objectives equal: {same}"
        if "node-milp-cbc" in per:
            line += f"; node-milp-cbc p50 / best p50 = {per['node-milp-cbc']['p50_s'] / best['p50_s']:.0f}x"
        ref_dp = per["dp-reference"]
        line += (f"; dp / dp-reference p50 x{per['dp']['p50_s'] / ref_dp['p50_s']:.3f}, "
                 f"p99 x{per['dp']['p99_s'] / ref_dp['p99_s']:.3f}")
        print(line)
    planner_module.solve_dp = solve_dp
    print(json.dumps({"results": [{k: r[k] for k in ("jobs", "nodes", "method", "p50_s", "p99_s", "objective")}
                                  for r in results]}))


if __name__ == "__main__":
    main()
