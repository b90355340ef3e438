"""A pilot's warm-up: how long from its worker pool's start to a worker that can start ranks (its rank
forkserver has imported torch and the fragment code), with the pilot's launch command as parsl-bft submits it
(the node's rank server imports torch while Parsl's pool starts: train/rank_server.py) against the same pool
without it (the worker's own forkserver imports torch once the worker is up), alternated in one invocation.

    python benchmarks/pilot_warmup.py [--rounds 5]

Each round starts a Parsl HighThroughputExecutor with one block through a LocalProvider (the scheduler's part,
sbatch to the batch script, is the same for both and left out), and times ``parsl.load`` -> the block's
first task, the warm-up a joined pilot gets (``apps.warm_up``), has returned. The interchange's start is in both
(about the same). Prints a line per run and, LAST, one JSON object with the medians and their ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path


def one_start(with_server: bool, run_dir: Path) -> float:
    """Seconds from loading a one-block HTEX to its warm-up task's result."""
    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD
    from parsl.providers import LocalProvider

    from parsl_bft.execution.apps import warm_up
    from parsl_bft.execution.config import ensure_venv_on_path, interchange_dies_with_us
    from parsl_bft.train.rank_server import LAUNCH

    ensure_venv_on_path()
    cmd = f"{LAUNCH} {DEFAULT_LAUNCH_CMD}" if with_server else DEFAULT_LAUNCH_CMD
    ex = HighThroughputExecutor(label="pilot", address="127.0.0.1", max_workers_per_node=1, launch_cmd=cmd,
                                interchange_launch_cmd=interchange_dies_with_us(),
                                provider=LocalProvider(init_blocks=1, min_blocks=0, max_blocks=1))
    t = time.perf_counter()
    dfk = parsl.load(Config(executors=[ex], run_dir=str(run_dir), strategy="none"))
    try:
        parsl.python_app(warm_up, executors=["pilot"])("", 1).result(timeout=300)
        return time.perf_counter() - t
    finally:
        dfk.cleanup()
        parsl.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"rank_server": [], "forkserver_only": []}
    load = os.getloadavg()[1]
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for mode in (("rank_server", "forkserver_only") if r % 2 == 0 else ("forkserver_only", "rank_server")):
                s = one_start(mode == "rank_server", Path(d) / f"{mode}-{r}")
                times[mode].append(s)
                print(f"round {r + 1}/{args.rounds} {mode}: warm in {s:.2f} s", flush=True)
    import parsl
    import torch

    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "benchmark": "pilot_warmup", "rounds": args.rounds,
        "warm_s_median": med, "warm_s": times,
        "ratio_rank_server_vs_forkserver_only": med["rank_server"] / med["forkserver_only"],
        "saved_s": med["forkserver_only"] - med["rank_server"],
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
        "load_5min_before": round(load, 2), "python": platform.python_version(), "parsl": parsl.__version__,
        "torch": torch.__version__, "platform": platform.platform(), "argv": sys.argv[1:]}))


if __name__ == "__main__":
    main()
