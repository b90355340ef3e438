"""Runtime overhead of the embedded default on the demo pattern: how long from "the plan gives a job nodes"
to "a fragment trains on them", and the share of held node-time spent training (goal: > 90 %).

Runs the demo (3 jobs, emulated Theta pool, 30x) in this process; LAST line: one JSON object.
"""
from __future__ import annotations

import json
import statistics
import tempfile

from rich.console import Console

from parsl_bft.execution.demo import run_demo
from parsl_bft.execution.state import StateDB


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        summary = run_demo(d, console=Console(quiet=True))
        db = StateDB(f"{d}/state/state.sqlite")
        lat = [e["train_started"] - e["launched"] for _, _, e in db.events("fragment-done")]
        joins = db.events("launch")
    out = {"fragments": len(lat), "launch_to_training_p50_s": statistics.median(lat) if lat else None,
           "launch_to_training_max_s": max(lat) if lat else None, "train_share": summary["train_share"],
           "wall_s": summary["wall_s"], "warm_up_s": summary["warm_up_s"], "launches": len(joins)}
    print(f"fragments {out['fragments']}, launch -> training p50 {out['launch_to_training_p50_s']:.2f} s "
          f"(max {out['launch_to_training_max_s']:.2f} s); held node-time spent training {out['train_share']:.1%} "
          f"(goal > 90 %); workers warmed up before the pool started: {out['warm_up_s']:.1f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
