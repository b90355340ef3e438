"""Layer elasticity (issue 15), measured: real training with and without auto-freezing, and the simulator.

1. Throughput: the digits CNN (benchmarks/digits_cnn.py) on 1 and --ranks ranks at every freeze level, the
   levels' steps interleaved in the same processes (benchmarks/layer_throughput.py; median step); the
   layer-aware model's held-out error is leave-one-out over the frozen points, printed per point.
2. Training: the same job twice through fragments on --ranks ranks (gloo, real HDF5 checkpoints, fragments of
   --fragment-steps steps, one epoch): freezing off, and freezing "auto" - after every fragment the planner
   (exact DP) reads the fragment's per-layer gradient statistics and picks the next fragment's level within the
   budget. The two runs' fragments alternate, so both see the same load on the machine; --repeats runs both
   again. Held-out accuracy after every fragment; time to target = wall time of the fragments (launch, restore,
   training, checkpoint) until the held-out accuracy first reaches the unfrozen run's final accuracy minus
   --target-gap. The images are upsampled to --size 32 so that a fragment's training outweighs its fixed costs
   (~1-2 s here) as it does in a backfill hole (minutes of training): at 16x16 an epoch trains in ~1 s.
3. Simulator: --jobs Philly jobs (a --freeze-share of them freezable) on a dedicated cluster of --cluster nodes
   at offered load --load (the draw from four days of Philly arrives at ~0.2: a cluster idle 80% of the time),
   and the same kind of jobs (one day of arrivals) on the Summit idle slice; freezing on vs off,
   same planner.

Prints tables, then (LAST line) one JSON object:
{"jct_ratio", "budget_violations", "throughput_mape", "time_to_target_ratio", "accuracy_delta", ...}
Usage: python benchmarks/freezing.py [--epochs 10] [--ranks 2] [--jobs 500] [--skip-training] [--skip-sim]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import digits_cnn  # noqa: E402  (here, not in the ranks: the forkserver preloads this module, scikit-learn with it)

WORKLOAD = f"{HERE / 'digits_cnn.py'}:DigitsCNN"
MODEL = "digits-cnn"


def workload_args(args, schedule: bool = True) -> dict:
    """The training run's arguments (the profile's short fragments have no run length to schedule over)."""
    return {"size": args.size, **({"schedule": "cosine"} if schedule else {})}


def profile_model(args):
    """Measure, fit, and print each frozen point's leave-one-out prediction. Two shared cores make a fragment's
    throughput swing 2x with the other work on the machine (`parsl-bft profile` times whole fragments, one
    configuration after another), so here every level trains in the same processes, one step each in turn
    (benchmarks/layer_throughput.py: the median step); forward shares are the median of --share-rounds
    measurements (a single one put the first convolution anywhere between 1% and 16%)."""
    import numpy as np
    from layer_throughput import measure

    from parsl_bft.planner.freeze import LayerThroughput
    from parsl_bft.scaling import LayerProfile, ScalingCurve
    from parsl_bft.train.profiler import measure_layer_shares

    wargs = workload_args(args, False)
    runs = [measure_layer_shares(WORKLOAD, args.batch, wargs) for _ in range(args.share_rounds)]
    n_layers = runs[0][0]
    shares = {f: (float(np.median([r[1][f][0] for r in runs])), runs[0][1][f][1]) for f in runs[0][1]}
    levels = list(range(n_layers - 1))
    rates = {n: measure(n, levels, workload=WORKLOAD, workload_args=wargs, batch=args.batch,
                        steps=args.profile_steps) for n in sorted({1, args.ranks})}
    base = {n: r[0] for n, r in rates.items()}
    lt = LayerThroughput(ScalingCurve(MODEL, base),
                         LayerProfile(MODEL, n_layers, {f: shares[f] for f in levels if f},
                                      {(n, f): x for n, r in rates.items() for f, x in r.items() if f}))
    held = lt.heldout()
    print(f"\n{'ranks':>5} {'frozen':>6} {'compute':>8} {'params':>7} {'samples/s':>10} {'x level 0':>9} "
          f"{'held-out prediction':>19} {'error':>7}")
    for n, r in rates.items():
        for f, x in r.items():
            c, q = shares[f]
            m, pred = held.get((n, f), (None, None))
            tail = f"{pred:19.1f} {pred / m - 1:+7.1%}" if m else ""
            print(f"{n:5d} {f:6d} {c:8.2f} {q:7.2f} {x:10.1f} {x / base[n]:9.2f} {tail}")
    mape = lt.heldout_mape()
    print(f"layer-aware throughput model: beta {lt.beta:.2f} gamma {lt.gamma:.2f} omega {lt.omega:.2f}, "
          f"held-out error {mape:.1%} (leave-one-out over the frozen points)")
    return lt, mape


class Arm:
    """One job through fragments; with ``auto`` the planner sets each fragment's freeze level."""

    def __init__(self, auto: bool, lt, args):
        from parsl_bft.jobs import JobSpec
        from parsl_bft.planner import JobState, Planner

        self.auto, self.args = auto, args
        self.total = args.epochs * 1437 // args.batch * args.batch
        spec = JobSpec("digits", MODEL, args.ranks, args.ranks, args.t_restart, args.t_restart, float(self.total),
                       freeze="auto" if auto else "off", accuracy_budget=args.budget if auto else 0.0)
        self.nodes = [f"n{i}" for i in range(args.ranks)]
        self.state = JobState(spec, lt.curve, tuple(self.nodes), layers=lt if auto else None)
        self.planner = Planner(method="dp", t_fwd=args.tfwd)
        self.dir = Path(tempfile.mkdtemp(prefix="parsl-bft-freezing-"))
        self.curve: list[dict] = []
        self.wall = 0.0

    @property
    def done(self) -> bool:
        return self.state.samples_done >= self.total

    def fragment(self) -> None:
        from parsl_bft.execution.layers import fragment_reported
        from parsl_bft.planner.freeze import GradStats, penalty_curve
        from parsl_bft.train.fragment import FragmentConfig
        from parsl_bft.train.launcher import run_fragment

        a, st = self.args, self.state
        cfg = FragmentConfig(job="digits", workload=WORKLOAD, checkpoint_dir=str(self.dir), world_size=a.ranks,
                             global_batch=a.batch, steps=a.fragment_steps, total_samples=self.total,
                             freeze_layers=st.freeze, grad_stats_interval=a.interval, fsync=False,
                             workload_args=workload_args(a))
        t = time.perf_counter()
        res = run_fragment(cfg)
        self.wall += time.perf_counter() - t
        fragment_reported(st, res)
        st.samples_done = res.samples_done
        self.curve.append({"wall_s": self.wall, "train_s": res.train_s, "samples": res.samples_done,
                           "level": st.freeze, "accuracy": digits_cnn.accuracy(res.checkpoint, size=a.size),
                           "spent": st.accuracy_spent,
                           # what the planner reads before the next fragment: the penalty of each level
                           "penalty": penalty_curve(GradStats.from_dict(st.grad_stats), st.layers.profile.n_layers)
                           if self.auto else None})
        if self.auto:
            st.freeze = self.planner.plan([st], self.nodes).freeze["digits"]


def time_to(curve: list[dict], target: float) -> float:
    return next((r["wall_s"] for r in curve if r["accuracy"] >= target), float("inf"))


def training(args, lt) -> dict:
    """Both arms, --repeats times; the ratio reported is the median repeat's (the accuracy curves do not depend on
    the machine's load, the wall times do)."""
    from parsl_bft.train.launcher import start_rank_server

    start_rank_server()      # its start-up (seconds) is no arm's: both arms' ranks fork from it
    runs = []
    for rep in range(args.repeats):
        arms = [Arm(False, lt, args), Arm(True, lt, args)]
        try:
            while not all(arm.done for arm in arms):     # fragments alternate: both arms see the same load
                for arm in arms if rep % 2 == 0 else arms[::-1]:
                    if not arm.done:
                        arm.fragment()
        finally:
            for arm in arms:
                shutil.rmtree(arm.dir, ignore_errors=True)
        runs.append(report(args, arms[0].curve, arms[1].curve))
    runs.sort(key=lambda r: r["time_to_target_ratio"])
    mid = dict(runs[len(runs) // 2])
    if len(runs) > 1:
        mid["time_to_target_ratios"] = [round(r["time_to_target_ratio"], 3) for r in runs]
    return mid


def report(args, off: list[dict], auto: list[dict]) -> dict:
    target = off[-1]["accuracy"] - args.target_gap
    print(f"\n{'fragment':>8} | {'off: wall s':>11} {'train s':>7} {'acc':>6} | {'auto: wall s':>12} {'train s':>7} "
          f"{'acc':>6} {'level':>5} {'spent':>7}  penalty of levels 1.. after it")
    for i in range(max(len(off), len(auto))):
        a = off[i] if i < len(off) else None
        b = auto[i] if i < len(auto) else None
        left = f"{a['wall_s']:11.1f} {a['train_s']:7.2f} {a['accuracy']:6.3f}" if a else " " * 26
        right = (f"{b['wall_s']:12.1f} {b['train_s']:7.2f} {b['accuracy']:6.3f} {b['level']:5d} {b['spent']:7.4f}  "
                 + " ".join(f"{p:.4f}" for p in b["penalty"][1:-1]) if b else "")
        print(f"{i + 1:8d} | {left} | {right}")
    t_off, t_auto = time_to(off, target), time_to(auto, target)
    print(f"target accuracy {target:.3f}: off {t_off:.1f} s, auto {t_auto:.1f} s (ratio {t_auto / t_off:.3f}); final "
          f"accuracy off {off[-1]['accuracy']:.4f}, auto {auto[-1]['accuracy']:.4f}; total wall off "
          f"{off[-1]['wall_s']:.1f} s, auto {auto[-1]['wall_s']:.1f} s")
    return {"time_to_target_ratio": t_auto / t_off, "accuracy_delta": auto[-1]["accuracy"] - off[-1]["accuracy"],
            "target_accuracy": target, "wall_ratio": auto[-1]["wall_s"] / off[-1]["wall_s"],
            "budget_spent": auto[-1]["spent"],
            "first_frozen_fragment": next((i + 1 for i, r in enumerate(auto) if r["level"]), None)}


def simulation(args) -> dict:
    from parsl_bft.idle.intervals import read_idle_intervals
    from parsl_bft.jobs import JobSet
    from parsl_bft.planner import Planner
    from parsl_bft.scaling import read_scaling_csv
    from parsl_bft.sim import simulate
    from parsl_bft.sim.philly import dedicated_cluster, offered_load, read_philly

    data = Path(args.data)
    curves = read_scaling_csv(data / "jobs" / "imagenet_mix.scaling.csv")
    trace = data / "eval" / "philly_2017_jobs_from_pollux.csv.gz"
    planner = Planner(method="dp", objective=args.objective, t_fwd=args.tfwd)
    out = {}
    settings = [("cluster", read_philly(trace, curves, n_jobs=args.jobs, freeze_share=args.freeze_share,
                                        accuracy_budget=args.budget, max_gpus=args.cluster,
                                        load=args.load or None), None)]
    print(f"\ncluster: {args.jobs} Philly jobs on {args.cluster} GPUs at offered load "
          f"{offered_load(settings[0][1], args.cluster):.2f} (their single-GPU work / the cluster's GPU-seconds "
          "between the first and the last arrival)")
    if not args.no_summit:
        idle = read_idle_intervals(data / "eval" / "summit_256n_24h_idle_intervals.csv.gz")
        day = read_philly(trace, curves, n_jobs=args.jobs, days=1.0, freeze_share=args.freeze_share,
                          accuracy_budget=args.budget, max_gpus=args.cluster)
        import dataclasses
        day = JobSet([dataclasses.replace(j, submit=idle.t0 + j.submit) for j in day.jobs], day.curves, day.layers)
        settings.append(("summit-idle", day, idle))
    print(f"\n{'setting':12} {'freezing':8} {'avg JCT h':>9} {'makespan h':>10} {'finished':>8} {'e_idle':>7} "
          f"{'e_used':>7} {'frozen':>7} {'over budget':>11} {'solve p50 ms':>12} {'p99 ms':>7} {'run s':>6}")
    for name, js, iv in settings:
        if iv is None:
            iv = dedicated_cluster(args.cluster, 0.0, max(j.submit for j in js.jobs) + 60 * 86400)
        for freeze in (False, True):
            t = time.perf_counter()
            m = simulate(iv, js, planner, freeze=freeze, until_done=name == "cluster",
                         max_concurrent=args.max_concurrent if name == "cluster" else args.max_concurrent_idle
                         ).metrics()
            out[(name, freeze)] = m
            print(f"{name:12} {'on' if freeze else 'off':8} {m['avg_jct_s'] / 3600:9.2f} {m['makespan_s'] / 3600:10.1f} "
                  f"{m['jobs_finished']:8d} {m['e_idle']:7.3f} {m['e_used']:7.3f} {m['frozen_share']:7.1%} "
                  f"{m['budget_violations']:11d} {m['solve_p50_s'] * 1e3:12.2f} {m['solve_p99_s'] * 1e3:7.2f} "
                  f"{time.perf_counter() - t:6.0f}")
    return {"jct_ratio": out[("cluster", True)]["avg_jct_s"] / out[("cluster", False)]["avg_jct_s"],
            "budget_violations": sum(out[(n, True)]["budget_violations"] for n, _, _ in settings),
            "solve_p99_s_freezing": max(out[(n, True)]["solve_p99_s"] for n, _, _ in settings),
            **({"jct_ratio_summit_idle": out[("summit-idle", True)]["avg_jct_s"]
                / out[("summit-idle", False)]["avg_jct_s"]} if not args.no_summit else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fragment-steps", type=int, default=22, help="steps per fragment (22: one epoch)")
    ap.add_argument("--interval", type=int, default=22,
                    help="steps per gradient-statistics interval (a fragment's: a restored fragment starts one)")
    ap.add_argument("--size", type=int, default=32, help="image side in pixels (the 8x8 digits upsampled)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of both arms (the median ratio is reported)")
    ap.add_argument("--profile-steps", type=int, default=40, help="timed steps per level (median)")
    ap.add_argument("--share-rounds", type=int, default=3, help="forward-share measurements (median)")
    ap.add_argument("--budget", type=float, default=0.005, help="accuracy budget of the freezable jobs")
    ap.add_argument("--target-gap", type=float, default=0.01,
                    help="target = the unfrozen run's final held-out accuracy minus this")
    ap.add_argument("--t-restart", type=float, default=2.0, help="t_up = t_down, seconds")
    ap.add_argument("--tfwd", type=float, default=300.0, help="planning look-ahead, seconds")
    ap.add_argument("--objective", default="jct")
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--cluster", type=int, default=48)
    ap.add_argument("--freeze-share", type=float, default=0.5)
    ap.add_argument("--load", type=float, default=0.8,
                    help="offered load of the cluster: arrivals compressed to it (0: the trace's own pace, ~0.2)")
    ap.add_argument("--max-concurrent", type=int, default=64, help="jobs admitted at once on the cluster")
    ap.add_argument("--max-concurrent-idle", type=int, default=10, help="... on the idle slice (BFTrainer's 10)")
    ap.add_argument("--data", default=str(HERE.parents[1] / "shared" / "data"))
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--no-summit", action="store_true", help="skip the replay on the Summit idle slice")
    args = ap.parse_args()
    result: dict = {}
    if not args.skip_training:
        lt, mape = profile_model(args)
        result["throughput_mape"] = mape
        result.update(training(args, lt))
    if not args.skip_sim:
        result.update(simulation(args))
    keys = ["jct_ratio", "budget_violations", "throughput_mape", "time_to_target_ratio", "accuracy_delta"]
    print(json.dumps({**{k: result.get(k) for k in keys}, **{k: v for k, v in result.items() if k not in keys}}))


if __name__ == "__main__":
    main()
