"""`parsl-bft demo`: three small jobs trained on an emulated idle pool replayed from a real Theta trace slice."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from .report import RunSummary

DEMO_JOBS: list[dict[str, Any]] = [
    dict(name="cnn-a", workload="images", samples=240_000, min_nodes=1, max_nodes=3, global_batch=64,
         workload_args={"n": 4096}, rate_guess=8000.0),
    dict(name="cnn-b", workload="images", samples=160_000, min_nodes=1, max_nodes=2, global_batch=64,
         workload_args={"n": 4096, "width": 24}, rate_guess=5000.0),
    dict(name="tiny-lm", workload="lm", samples=24_000, min_nodes=1, max_nodes=2, global_batch=32,
         workload_args={"n_chars": 60_000}, rate_guess=600.0),
]


def run_demo(out: str | Path, *, speedup: float = 30.0, console: Console | None = None, fresh: bool = True,
             warm_up: bool = True, jobs: list[dict[str, Any]] | None = None) -> RunSummary:
    """The demo's run; ``jobs`` (TrainingJob fields) replaces its three models (tests use small ones)."""
    import parsl
    from rich.console import Console

    from ..planner import Planner
    from ..plots import plot_allocation
    from .config import local_config
    from .live import LiveBars
    from .orchestrator import Orchestrator, TrainingJob
    from .pool import EmulatedPool
    from .statedir import check_plain_path

    console = console or Console()
    out = Path(out)
    check_plain_path(out, "--out folder")        # its runinfo/ reaches the worker pool's command unquoted
    state = out / "state"
    if fresh and state.exists():
        shutil.rmtree(state)
    out.mkdir(parents=True, exist_ok=True)
    pool = EmulatedPool.demo(speedup=speedup, notice_s=2.0, repeat=True)
    console.print(f"emulated idle pool: {pool.intervals.n_nodes} nodes of ALCF Theta (2022), one hour replayed "
                  f"{speedup:.0f}x faster, reclaim notice 2 s; planner: exact size-choice DP, speedup objective")
    with parsl.load(local_config(workers=5, run_dir=str(out / "runinfo"))):
        orch = Orchestrator(state, pool, Planner(method="dp", objective="speedup", t_fwd=30.0), max_concurrent=3,
                            warm_up=warm_up)
        for j in jobs or DEMO_JOBS:
            orch.submit(TrainingJob(**j))
        try:
            with LiveBars(console) as bars:
                summary = orch.run(progress=bars, timeout_s=600)
        finally:
            orch.close()            # the state directory's lock file and database (else: "unclosed file")
    results = _print_results(console, summary, pool.intervals.n_nodes)
    tl = orch.timeline
    plot_allocation(tl.t, tl.idle, tl.held, summary.wall_s, str(out / "demo.png"),
                    title="parsl-bft demo: nodes per job on the emulated idle pool", xlabel="seconds", scale=1.0)
    (out / "demo.json").write_text(json.dumps({**summary.as_dict(), "final_checkpoints": results}, indent=1))
    console.print(f"wrote {out / 'demo.png'} and {out / 'demo.json'}")
    return summary


def _print_results(console: Console, summary: RunSummary, n_nodes: int) -> dict[str, str | None]:
    """The demo's table and notes; returns each job's newest checkpoint (done or not)."""
    from rich.table import Table

    from .events import RunEnd
    from .ledger import ref_words, stop_words

    results = {r.job: r.checkpoint for r in summary.jobs}       # the newest, done or not
    ended = summary.ended
    t = Table(title=f"demo finished in {summary.wall_s:.0f} s" if ended == RunEnd.DONE else
              f"demo stopped after {summary.wall_s:.0f} s: {stop_words(ended or RunEnd.STOPPED)}")
    for c in ("job", "status", "samples", "fragments", "rescales", "reclaims", "node-s held", "E_used"):
        t.add_column(c, justify="right")
    for r in summary.jobs:
        t.add_row(r.job, r.status, f"{r.samples:,}", str(r.fragments), str(r.rescales), str(r.reclaims),
                  f"{r.node_s:.0f}", "-" if r.e_used is None else f"{r.e_used:.2f}")
    console.print(t)
    console.print("E_used: samples kept at the job's reference rate per node-second held; reference: "
                  + ", ".join(f"{r.job}: {ref_words(asdict(r.ref_rate) if r.ref_rate else None)}"
                              for r in summary.jobs))
    console.print(f"held node-time spent training: {summary.train_share:.1%} (workers warmed up first: "
                  f"{summary.warm_up_s:.0f} s); final checkpoints: "
                  + ", ".join(f"{n}: {Path(p).name if p else '-'}" for n, p in results.items()))
    console.print(f"the {n_nodes} emulated nodes share this machine's {os.cpu_count()} cores, so E_used "
                  "here also measures their crowding; the README's e_idle figures are a different measure")
    return results
