"""Layer elasticity, measured: real training with and without auto-freezing over several seeds, and the
dedicated-cluster replay over several Philly draws, beside baseline schedulers.

1. Training (``--seeds`` seeds per model, one process, one thread): the digits CNN (benchmarks/digits_cnn.py)
   and a small transformer on made sequences (benchmarks/seq_transformer.py), each on a 60/20/20 train /
   validation / test split fixed by the seed. First the throughput of every freeze level (every level's step
   in turn, median; the layer-aware model fitted on it, its leave-one-out error printed). Then two arms per
   seed, the same batches in the same order, their epochs alternating so that both see the same load on the
   machine: freezing off, and freezing "auto" - after every epoch the planner (exact DP) reads the epoch's
   per-layer gradient statistics and sets the next epoch's level within the accuracy budget (a level change
   rebuilds the optimizer, its state carried, inside the timed part). Time to target = training wall time until
   the VALIDATION accuracy first reaches the unfrozen arm's final validation accuracy minus --target-gap;
   accuracy_delta = final TEST accuracy, auto minus off. Evaluation is not timed; what a fragment pays per
   restart (launch, restore, checkpoint) is not here either: both arms pay it alike at every epoch boundary.
2. Cluster (``--draws`` Philly draws, seeds 0..): --jobs jobs on --cluster dedicated GPUs at offered load
   --load; the same elastic planner with freezing on and off, every job freezable (share 1) and half of them
   (share 0.5, where the non-freezable jobs' own average JCT is compared too); median and worst ratio.
3. Baselines on the same replay and jobs, rigid at their requested sizes (parsl_bft/sim/baselines.py): a
   Tiresias-like 2D-LAS and FIFO with EASY backfilling. Not IceFrog's testbed.
4. Sensitivity: the JCT ratio over --shares x --loads (--sensitivity-draws draws each).

Prints tables, then (LAST line) one JSON object: jct_ratio_median / _max, nonfreezable_ratio, budget_violations,
time_to_target_median, accuracy_delta_mean, jct_vs_best_baseline, solve_p99_s_freezing, sensitivity, ...
Usage: python benchmarks/freezing.py [--draws 5] [--seeds 5] [--jobs 200] [--quick] [--smoke] [--skip-training]
[--skip-sim] [--skip-sensitivity]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from freeze_training import MODELS, train_model  # noqa: E402


def _jct(res, names: set[str] | None = None) -> float:
    """Average JCT (submit to end) of the jobs ``names`` (all: None) of a replay."""
    rows = [r for r in res.job_rows() if names is None or r["name"] in names]
    return statistics.fmean((r["finished_at"] if r["finished_at"] is not None else res.end) - r["submit"]
                            for r in rows)


class Cluster:
    """The replays of one benchmark invocation: jobs per (draw, share, load), results cached."""

    def __init__(self, args) -> None:
        from parsl_bft.planner import Planner
        from parsl_bft.scaling import read_scaling_csv

        self.args = args
        data = Path(args.data)
        self.curves = read_scaling_csv(data / "jobs" / "imagenet_mix.scaling.csv")
        self.trace = data / "eval" / "philly_2017_jobs_from_pollux.csv.gz"
        self.planner = lambda: Planner(method="dp", objective=args.objective, t_fwd=args.tfwd)
        self.runs: dict[tuple, object] = {}

    def jobs(self, draw: int, share: float, load: float, rigid: bool = False):
        from parsl_bft.sim.philly import read_philly

        a = self.args
        return read_philly(self.trace, self.curves, n_jobs=a.jobs, freeze_share=share, accuracy_budget=a.budget,
                           max_gpus=a.cluster, load=load, seed=draw, rigid=rigid)

    def run(self, draw: int, share: float, load: float, how: str):
        """how: "on" / "off" (the elastic planner, freezing on / off) or a baseline's name."""
        from parsl_bft.sim import simulate
        from parsl_bft.sim.baselines import FifoBackfill, TiresiasLas
        from parsl_bft.sim.philly import dedicated_cluster

        key = (draw, share, load, how)
        if share == 0 and how == "on":          # no job may freeze: the same replay as freezing off
            return self.run(draw, share, load, "off")
        if key not in self.runs:
            rigid = how not in ("on", "off")
            js = self.jobs(draw, share, load, rigid)
            iv = dedicated_cluster(self.args.cluster, 0.0, max(j.submit for j in js.jobs) + 60 * 86400)
            planner = {"tiresias": TiresiasLas, "fifo-backfill": FifoBackfill}.get(how, self.planner)()
            # rigid schedulers keep their own queue of every arrived job; the elastic planner admits FCFS
            conc = len(js.jobs) if rigid else self.args.max_concurrent
            t = time.perf_counter()
            self.runs[key] = simulate(iv, js, planner, freeze=how == "on", until_done=True, max_concurrent=conc)
            print(f"  draw {draw} share {share:g} load {load:g} {how:13}: avg JCT "
                  f"{_jct(self.runs[key]) / 3600:6.2f} h ({time.perf_counter() - t:.0f} s)", flush=True)
        return self.runs[key]

    def ratio(self, draw: int, share: float, load: float) -> float:
        return _jct(self.run(draw, share, load, "on")) / _jct(self.run(draw, share, load, "off"))


def cluster(args, c: Cluster) -> dict:
    """Sections 2 and 3 (module doc)."""
    from parsl_bft.sim.philly import offered_load

    draws, load = range(args.draws), args.load
    print(f"\ncluster: {args.jobs} Philly jobs per draw on {args.cluster} GPUs at offered load "
          f"{offered_load(c.jobs(0, 1.0, load), args.cluster):.2f}; draws (trace seeds) {list(draws)}")
    rows = []
    for d in draws:
        on, off = c.run(d, 1.0, load, "on"), c.run(d, 1.0, load, "off")
        half_on, half_off = c.run(d, 0.5, load, "on"), c.run(d, 0.5, load, "off")
        fixed = {j.name for j in c.jobs(d, 0.5, load).jobs if j.freeze == "off"}
        base = {b: _jct(c.run(d, 1.0, load, b)) for b in ("tiresias", "fifo-backfill")}
        m = on.metrics()
        rows.append({"draw": d, "jct_on_h": _jct(on) / 3600, "jct_off_h": _jct(off) / 3600,
                     "ratio": _jct(on) / _jct(off), "ratio_half": _jct(half_on) / _jct(half_off),
                     "nonfreezable_ratio": _jct(half_on, fixed) / _jct(half_off, fixed),
                     "tiresias_h": base["tiresias"] / 3600, "fifo_h": base["fifo-backfill"] / 3600,
                     "vs_best_baseline": _jct(on) / min(base.values()),
                     "violations": m["budget_violations"] + half_on.metrics()["budget_violations"],
                     "frozen": m["frozen_share"], "solve_p99": max(m["solve_p99_s"], half_on.metrics()["solve_p99_s"])})
    print(f"\n{'draw':>4} | {'avg JCT h: off':>14} {'on':>6} {'ratio':>6} | share 0.5: {'ratio':>6} "
          f"{'non-freezable':>13} | {'frozen':>6} {'over budget':>11} {'solve p99 ms':>12}")
    for r in rows:
        print(f"{r['draw']:4d} | {r['jct_off_h']:14.2f} {r['jct_on_h']:6.2f} {r['ratio']:6.3f} | "
              f"{'':10} {r['ratio_half']:6.3f} {r['nonfreezable_ratio']:13.3f} | {r['frozen']:6.1%} "
              f"{r['violations']:11d} {r['solve_p99'] * 1e3:12.1f}")
    print("\nbaselines on the same replay, rigid at the requested sizes (not IceFrog's testbed):")
    print(f"{'draw':>4} | {'elastic+freezing h':>18} {'Tiresias-like 2D-LAS h':>22} {'FIFO+EASY backfill h':>20} "
          f"| {'freezing / best':>15}")
    for r in rows:
        print(f"{r['draw']:4d} | {r['jct_on_h']:18.2f} {r['tiresias_h']:22.2f} {r['fifo_h']:20.2f} | "
              f"{r['vs_best_baseline']:15.3f}")
    ratios = [r["ratio"] for r in rows]
    return {"jct_ratio_median": statistics.median(ratios), "jct_ratio_max": max(ratios),
            "jct_ratios": [round(x, 3) for x in ratios],
            "nonfreezable_ratio": max(r["nonfreezable_ratio"] for r in rows),
            "nonfreezable_ratio_median": statistics.median(r["nonfreezable_ratio"] for r in rows),
            "jct_ratio_share_half_median": statistics.median(r["ratio_half"] for r in rows),
            "budget_violations": sum(r["violations"] for r in rows),
            "jct_vs_best_baseline": statistics.median(r["vs_best_baseline"] for r in rows),
            "jct_vs_best_baseline_max": max(r["vs_best_baseline"] for r in rows),
            "jct_vs_tiresias": statistics.median(r["jct_on_h"] / r["tiresias_h"] for r in rows),
            "jct_vs_fifo_backfill": statistics.median(r["jct_on_h"] / r["fifo_h"] for r in rows),
            "solve_p99_s_freezing": max(r["solve_p99"] for r in rows)}


def sensitivity(args, c: Cluster) -> dict:
    """Section 4: the median JCT ratio per (share, load)."""
    shares = [float(x) for x in args.shares.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    table = {}
    for load in loads:
        for share in shares:
            table[f"{share:g}@{load:g}"] = statistics.median(c.ratio(d, share, load)
                                                             for d in range(args.sensitivity_draws))
    print(f"\nJCT ratio, freezing on / off (median of {args.sensitivity_draws} draws)")
    print(f"{'load':>5} | " + " ".join(f"share {s:<5g}" for s in shares))
    for load in loads:
        print(f"{load:5g} | " + " ".join(f"{table[f'{s:g}@{load:g}']:11.3f}" for s in shares))
    return {"sensitivity": {k: round(v, 3) for k, v in table.items()}}


def training(args) -> dict:
    """Section 1 over both models; the headline figures pool every (model, seed) pair."""
    out: dict = {}
    pairs = []
    for name in args.models.split(","):
        res = train_model(name, args)
        pairs += res.pop("pairs")
        out.update({f"{k}_{name}": v for k, v in res.items()})
    ttt = [p["time_to_target_ratio"] for p in pairs]
    out["time_to_target_median"] = statistics.median(ttt)      # inf: most auto arms never reached the target
    out["time_to_target_reached"] = f"{sum(x < float('inf') for x in ttt)}/{len(ttt)}"
    out["accuracy_delta_mean"] = statistics.fmean(p["accuracy_delta"] for p in pairs)
    out["training_budget_violations"] = sum(p["spent"] > args.budget + 1e-9 for p in pairs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="training seeds per model")
    ap.add_argument("--models", default=",".join(MODELS), help=f"training models ({', '.join(MODELS)})")
    ap.add_argument("--epochs", type=int, default=0, help="epochs per training run (0: the model's own)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--budget", type=float, default=0.005, help="accuracy budget of every freezable job")
    ap.add_argument("--target-gap", type=float, default=0.01,
                    help="target = the unfrozen arm's final validation accuracy minus this")
    ap.add_argument("--t-restart", type=float, default=0.05,
                    help="seconds a level change costs the training job as the planner sees it")
    ap.add_argument("--profile-steps", type=int, default=30, help="timed steps per level (median)")
    ap.add_argument("--tfwd", type=float, default=300.0, help="planning look-ahead, seconds")
    ap.add_argument("--objective", default="jct")
    ap.add_argument("--draws", type=int, default=5, help="Philly draws (trace seeds 0..)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per draw")
    ap.add_argument("--cluster", type=int, default=48)
    ap.add_argument("--load", type=float, default=0.8, help="offered load of the headline rows")
    ap.add_argument("--max-concurrent", type=int, default=64, help="jobs the elastic planner admits at once")
    ap.add_argument("--shares", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--loads", default="0.5,0.8,1.0")
    ap.add_argument("--sensitivity-draws", type=int, default=3)
    ap.add_argument("--data", default=str(HERE.parents[1] / "shared" / "data"))
    ap.add_argument("--quick", action="store_true", help="3 draws of 100 jobs, 3 seeds, 1 sensitivity draw")
    ap.add_argument("--smoke", action="store_true", help="a few seconds: the code paths, not a result")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--skip-sensitivity", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.draws, args.jobs, args.seeds, args.sensitivity_draws = 3, 100, 3, 1
    if args.smoke:
        args.draws, args.jobs, args.seeds, args.sensitivity_draws, args.epochs = 1, 12, 1, 1, 3
        args.profile_steps, args.shares, args.loads = 3, "0,1", "0.8"
    t = time.perf_counter()
    result: dict = {}
    if not args.skip_training:
        result.update(training(args))
    if not args.skip_sim:
        c = Cluster(args)
        result.update(cluster(args, c))
        if not args.skip_sensitivity:
            result.update(sensitivity(args, c))
    if "training_budget_violations" in result:       # jobs of the replays and training runs over their budget
        result["budget_violations"] = result.get("budget_violations", 0) + result["training_budget_violations"]
    result["run_s"] = round(time.perf_counter() - t)
    keys = ["jct_ratio_median", "jct_ratio_max", "nonfreezable_ratio", "budget_violations", "time_to_target_median",
            "accuracy_delta_mean", "jct_vs_best_baseline"]
    print(json.dumps({**{k: result.get(k) for k in keys}, **{k: v for k, v in result.items() if k not in keys}}))


if __name__ == "__main__":
    main()
