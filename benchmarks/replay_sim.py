"""The simulator on a facility replay's stretch (benchmarks/facility_replay.py): `parsl-bft simulate` replays the
alone run's idle nodes (``idle_intervals``) with the same emulated jobs under the costs the run measured, so its
e_idle can be set beside the runtime's; the pilots' start-up (``pilot_start_s``), which a replay of idle intervals
does not see, is charged as a late start of each interval.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from facility_stream import Replayed
from replay_training import Emulated, Training

from parsl_bft.execution.jobstore import JobStore


def idle_intervals(alone: Replayed, nodes: int, window_s: float) -> list[tuple[str, float, float]]:
    """Each node's idle intervals in the alone run, within [0, window_s]."""
    busy: dict[str, list[tuple[float, float]]] = {f"n{i}": [] for i in range(1, nodes + 1)}
    for r in alone.facility().values():
        if r.start is not None:
            for n in r.nodes:
                busy.setdefault(n, []).append((r.start, window_s if r.end is None else min(r.end, window_s)))
    out = []
    for n, spans_ in busy.items():
        t = 0.0
        for a, b in sorted(spans_):
            if a > t:
                out.append((n, t, min(a, window_s)))
            t = max(t, b)
        if t < window_s:
            out.append((n, t, window_s))
    return [(n, a, b) for n, a, b in out if b > a]


def pilot_start_s(rep: Replayed, state: Path, t0: float, from_hole: bool = True) -> float:
    """Median seconds from a node going idle (``from_hole``; else: from its pilot's start) to the first fragment
    launched on it by a pilot there: the survey that sees the hole, sbatch, Slurm's start, the worker pool's
    connection, its warm-up and the plan (what a replay of idle intervals does not see: it takes a node as
    usable the moment it is idle)."""
    launches = [(t - t0, set(e["nodes"])) for t, _, e in JobStore(state / "state.sqlite", readonly=True)
                .events("launch")]
    ends: dict[str, list[float]] = {}
    for r in rep.records:
        if r.start is not None and r.end is not None:
            for n in r.nodes:
                ends.setdefault(n, []).append(r.end)
    waits = []
    for p in rep.pilots():
        if p.start is None:
            continue
        first = min((t for t, ns in launches if t >= p.start and ns & set(p.nodes)), default=None)
        if first is None or (p.end is not None and first > p.end):
            continue                       # never trained: that pilot's time is held, not a start-up
        since = max((e for n in p.nodes for e in ends.get(n, []) if e <= p.start), default=0.0)
        waits.append(first - (since if from_hole else p.start))
    return statistics.median(waits) if waits else 0.0


def held_spans(rep: Replayed, window_s: float) -> list[tuple[str, float, float]]:
    """Each node's spans under a pilot, within [0, window_s]."""
    return [(n, p.start, min(window_s, window_s if p.end is None else p.end)) for p in rep.pilots()
            if p.start is not None and p.start < window_s for n in p.nodes]


def simulate(idle: list[tuple[str, float, float]], t0: float, tr: Training, emu: Emulated, d: Path,
             late_s: float = 0.0) -> dict:
    """`parsl-bft simulate` on ``idle`` ((node, start, end), s from ``t0``), the same two jobs (``emu``), the costs
    this run measured; with ``late_s``, each interval is taken as usable that much after it begins (the pilots'
    start-up), and e_idle is stated against the intervals as they were."""
    d.mkdir(parents=True, exist_ok=True)
    t0 = round(t0)
    usable = [(n, a + late_s, b) for n, a, b in idle if b > a + late_s]
    with open(d / "idle.csv", "w") as f:
        f.write("node,idle_start,idle_end\n")
        f.writelines(f"{n},{t0 + a:.3f},{t0 + b:.3f}\n" for n, a, b in usable)
    # a resize pauses a job for what this run measured (last step -> next first step), else launch -> first step
    # and the save (a run with no resize)
    restart = tr.pause_s or tr.restart_s + tr.save_s
    (d / "emu.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\n" + "".join(
        f"emu-{x},emulated,1,{emu.max_nodes},{restart:.3f},{restart:.3f},{10**12},{t0}\n" for x in "ab"))
    (d / "emu.scaling.csv").write_text("model,nodes,samples_per_sec\n" + "".join(
        f"emulated,{n},{emu.rate(n):.3f}\n" for n in range(1, emu.max_nodes + 1)))
    (d / "emu.costs.csv").write_text(
        "model,device,restart_s,launch_s,restore_s,first_step_s,warmup_s,save_s,stall_s,notice_reservation,"
        f"notice_preemption,estimate\nemulated,emulated,{restart:.3f},0,0,0,0,{tr.save_s:.3f},"
        "0.001,1,1,0\n")
    cli = str(Path(sys.executable).with_name("parsl-bft"))
    r = subprocess.run([cli, "simulate", "--idle-intervals", str(d / "idle.csv"), "--jobs", str(d / "emu.jobs.csv"),
                        "--costs", str(d / "emu.costs.csv"), "--objective", "throughput", "--tfwd", "20",
                        "--no-mask", "--no-ceiling", "--max-concurrent", "2", "--json", str(d / "sim.json")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"parsl-bft simulate failed: {r.stderr[-2000:]}")
    metrics: dict = json.loads((d / "sim.json").read_text())
    idle_s = sum(b - a for _, a, b in idle)
    metrics["e_idle_of_all_idle"] = metrics["e_idle"] * metrics["idle_node_s"] / idle_s if idle_s else 0.0
    return metrics
