"""What a fragment pays besides training, phase by phase: the digits CNN of benchmarks/freezing.py (2 gloo ranks,
real HDF5 checkpoints, images upsampled to 32x32), one job through --fragments fragments of --steps steps, each
restoring the last one's checkpoint.

Two arms, each in its own driver process (a process has one forkserver), their fragments alternating so both
see the same load on the shared cores:
  preload   the launcher as it is: the rank forkserver has also run the driver's main script once
            (train/rank_preload.py), so a rank starts with it in place;
  baseline  the forkserver does not get the main script (what the launcher did on Python 3.11 and 3.12, where
            multiprocessing's own preloading of '__main__' is dead code): every rank re-runs it, here this
            script and what it imports (scikit-learn, as freezing.py does; on a Parsl worker it is
            process_worker_pool.py and all of Parsl).
Both arms use the same code otherwise. With --baseline-tree DIR the baseline arm is instead the parsl_bft of
another checkout as it is (e.g. `git worktree add /tmp/before <commit>`): every change since, measured at once.

Phases (FragmentResult's own timers; launch = call -> training minus restore and rendezvous): launch (processes
from the forkserver, the main script where it is re-run, signals, the store handshake), restore (workload, data
set, model, checkpoint), rendezvous (gloo group, DDP), save (the final checkpoint and the closing barrier), exit
(the ranks' exit until run_fragment returns). Fixed = wall - training. Medians over the fragments after each
arm's first (the first restores nothing).
Usage: python benchmarks/fragment_overhead.py [--fragments 8] [--steps 5] [--baseline-tree DIR]
LAST line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import digits_cnn  # noqa: E402  (as in freezing.py: the main script imports scikit-learn)

WORKLOAD = f"{digits_cnn.__file__}:DigitsCNN"
PHASES = ("launch", "restore", "rendezvous", "save", "exit")
ARMS = ("baseline", "preload")


def driver(arm: str, steps: int) -> None:
    """One arm: a fragment per line read from stdin, its phases as one JSON line on stdout."""
    from parsl_bft.train import launcher
    from parsl_bft.train.fragment import FragmentConfig

    if arm == "baseline" and hasattr(launcher, "MAIN_ENV"):      # not where the baseline is an older checkout
        launcher.MAIN_ENV += "-not-read"       # the forkserver's rank_preload finds no main module to prepare
    launcher.start_rank_server()
    job = Path(tempfile.mkdtemp(prefix="parsl-bft-overhead-"))
    try:
        print("ready", flush=True)
        for _ in sys.stdin:
            cfg = FragmentConfig(job="digits", workload=WORKLOAD, checkpoint_dir=str(job), world_size=2,
                                 global_batch=64, steps=steps, fsync=False,
                                 workload_args={"size": 32, "schedule": "cosine"}, total_samples=64 * 10_000)
            t, start = time.perf_counter(), time.time()
            r = launcher.run_fragment(cfg)
            wall = time.perf_counter() - t
            to_train = r.train_started - start
            print(json.dumps({"wall": wall, "train": r.train_s, "fixed": wall - r.train_s,
                              "launch": to_train - r.restore_s - r.rendezvous_s, "restore": r.restore_s,
                              "rendezvous": r.rendezvous_s, "save": r.checkpoint_s,
                              "exit": wall - to_train - r.train_s - r.checkpoint_s}), flush=True)
    finally:
        shutil.rmtree(job, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fragments", type=int, default=8, help="fragments per arm")
    ap.add_argument("--steps", type=int, default=5, help="training steps per fragment (fixed costs do not "
                    "depend on it)")
    ap.add_argument("--baseline-tree", type=Path, help="the baseline arm runs the parsl_bft of this checkout")
    ap.add_argument("--driver", choices=ARMS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fragments < 2 or args.steps < 1:
        ap.error("--fragments must be >= 2 (the first restores nothing) and --steps >= 1")
    if args.baseline_tree and not (args.baseline_tree / "parsl_bft" / "__init__.py").is_file():
        ap.error(f"--baseline-tree {args.baseline_tree}: no parsl_bft package there")
    if args.driver:
        driver(args.driver, args.steps)
        return
    env, cwd = {arm: dict(os.environ) for arm in ARMS}, {arm: None for arm in ARMS}
    if args.baseline_tree:
        tree = args.baseline_tree.resolve()
        env["baseline"]["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
        cwd["baseline"] = tree      # the forkserver (python -c) finds packages in its working directory first
    procs = {arm: subprocess.Popen([sys.executable, __file__, "--driver", arm, "--steps", str(args.steps)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env[arm],
                                   cwd=cwd[arm]) for arm in ARMS}
    rows: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    try:
        for arm, p in procs.items():
            if p.stdout.readline().strip() != "ready":
                sys.exit(f"the {arm} driver did not start (exit {p.wait()})")
        for i in range(args.fragments):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                procs[arm].stdin.write("run\n")
                procs[arm].stdin.flush()
                line = procs[arm].stdout.readline()
                if not line:
                    sys.exit(f"the {arm} driver died (exit {procs[arm].wait()})")
                rows[arm].append(json.loads(line))
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait()
    med = {arm: {k: statistics.median(r[k] for r in rows[arm][1:]) for k in rows[arm][0]} for arm in ARMS}
    print(f"\n{'arm':9} {'fixed s':>7} " + " ".join(f"{k:>10}" for k in PHASES) + f" {'train s':>7}")
    for arm in ARMS:
        m = med[arm]
        print(f"{arm:9} {m['fixed']:7.3f} " + " ".join(f"{m[k]:10.3f}" for k in PHASES) + f" {m['train']:7.3f}")
    ratio = med["preload"]["fixed"] / med["baseline"]["fixed"]
    print(f"fixed cost per fragment, preload / baseline: {ratio:.2f} (median of {args.fragments - 1} fragments "
          f"each, {args.steps} steps a fragment)")
    print(json.dumps({"fixed_ratio": ratio, **{f"{arm}_{k}_s": round(v, 4) for arm in ARMS
                                               for k, v in med[arm].items()}}))


if __name__ == "__main__":
    main()
