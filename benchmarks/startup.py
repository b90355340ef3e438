"""Start-up: how long from ``parsl-bft run`` to the first training step on the embedded default, and how long a
finished workflow takes to run again (nothing to train), each beside a plain ``python -c "import torch"`` timed in
the same invocation (this machine is shared: absolute times drift, the ratios less so).

    python benchmarks/startup.py              # 3 rounds; prints a line per round and, LAST, one JSON object

Each round starts afresh in a new state directory: one small job (the built-in ``images`` workload, 1-2 nodes)
in a workflow file, run as a user runs it. The first step is when rank 0's live progress (``progress.json`` in
the job's folder) first reports a step; the run then goes on to the job's end, and the same command is run
again: the job is done, so that second run has nothing to train. Goals (issue 38, on a quiet 2-core machine):
first step <= 15 s, rerun <= 5 s; the load average is printed with them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKFLOW = """\
from parsl_bft.execution import TrainingJob, training_session

with training_session("state") as trainer:
    trainer.submit(TrainingJob("first", workload="images", samples=64 * 40, global_batch=64, max_nodes=2,
                               workload_args={"n": 512, "width": 8}))
    trainer.run()
"""
BIN = Path(sys.executable).parent


def import_torch_s() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t


def first_step(folder: Path, timeout_s: float) -> tuple[float, float]:
    """(seconds to the first reported step, seconds to the run's end) of ``parsl-bft run`` in ``folder``."""
    progress = folder / "state" / "jobs" / "first" / "progress.json"
    t = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "parsl-bft"), "run", "workflow.py"], cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None and time.perf_counter() - t < timeout_s:
        if first is None and progress.exists():
            try:
                if json.loads(progress.read_text()).get("step", 0) >= 1:
                    first = time.perf_counter() - t
            except (json.JSONDecodeError, OSError):      # rank 0 replaces it as we read: read it again
                pass
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        sys.exit(f"ran out of time: the run had not ended after {timeout_s:.0f} s (first step: {first})")
    if proc.returncode != 0 or first is None:
        sys.exit(f"the run failed (exit {proc.returncode}, first step {first}): {proc.stderr.read()[-2000:]}")
    return first, time.perf_counter() - t


def rerun(folder: Path) -> float:
    t = time.perf_counter()
    r = subprocess.run([str(BIN / "parsl-bft"), "run", "workflow.py"], cwd=folder, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the rerun failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a round's first run may take")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            (folder / "workflow.py").write_text(WORKFLOW)
            base = import_torch_s()
            first, total = first_step(folder, args.timeout)
            again = rerun(folder)
        rows.append({"import_torch_s": base, "first_step_s": first, "run_s": total, "rerun_s": again})
        print(f"round {i + 1}: import torch {base:.1f} s; first step {first:.1f} s (x{first / base:.1f}); "
              f"run {total:.1f} s; rerun {again:.1f} s (x{again / base:.1f})", file=sys.stderr)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(json.dumps({**{f"{k}_median": round(v, 2) for k, v in med.items()},
                      "first_step_vs_import_torch": round(med["first_step_s"] / med["import_torch_s"], 2),
                      "rerun_vs_import_torch": round(med["rerun_s"] / med["import_torch_s"], 2),
                      "goal_first_step_s": 15, "goal_rerun_s": 5, "rounds": args.rounds,
                      "load_1min_before": round(load, 2), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
