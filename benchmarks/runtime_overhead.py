"""Runtime overhead of the embedded default on the demo pattern: how long from "the plan gives a job nodes"
to "a fragment trains on them", and the share of held node-time spent training (goal: > 90 %).

Runs the demo (3 jobs, emulated Theta pool, 30x) twice in this process - workers cold (the baseline), then warmed
up before the pool starts - and prints the ratios; LAST line: one JSON object.
"""
from __future__ import annotations

import json
import statistics
import tempfile

from rich.console import Console

from parsl_bft.execution.demo import run_demo
from parsl_bft.execution.jobstore import JobStore


def measure(warm_up: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        summary = run_demo(d, console=Console(quiet=True), warm_up=warm_up)
        db = JobStore(f"{d}/state/state.sqlite")
        lat = [e["train_started"] - e["launched"] for _, _, e in db.events("fragment-done")]
    return {"fragments": len(lat), "launch_to_training_p50_s": statistics.median(lat) if lat else None,
            "launch_to_training_max_s": max(lat) if lat else None, "train_share": summary["train_share"],
            "wall_s": summary["wall_s"], "warm_up_s": summary["warm_up_s"]}


def main() -> None:
    out = {}
    for name, warm in (("cold workers", False), ("warmed up", True)):
        r = out[name] = measure(warm)
        print(f"{name:>12}: {r['fragments']} fragments, launch -> training p50 {r['launch_to_training_p50_s']:.2f} s "
              f"(max {r['launch_to_training_max_s']:.2f} s), held node-time spent training {r['train_share']:.1%}, "
              f"warm-up before the pool {r['warm_up_s']:.1f} s")
    cold, warm = out["cold workers"], out["warmed up"]
    out["train_share_ratio"] = warm["train_share"] / cold["train_share"]
    out["launch_p50_ratio"] = warm["launch_to_training_p50_s"] / cold["launch_to_training_p50_s"]
    print(f"warmed up / cold: train share x{out['train_share_ratio']:.2f}, launch -> training p50 "
          f"x{out['launch_p50_ratio']:.2f} (goal: train share > 90 %)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
