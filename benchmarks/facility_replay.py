"""What parsl-bft does to a facility's jobs, and how much training it gets from the holes, on a real scheduler.

A stretch of a production log (default: 40 min of ALCF Theta 2022) is replayed as real sbatch jobs on the
local Slurm (tools/local-slurm.sh, 8 virtual nodes; how a log's job becomes a local one:
benchmarks/facility_stream.py), time compressed 5x: a pilot's start-up (seconds, not compressed) is then about
the share of a hole it is on a real machine, where it takes tens of seconds. The same stream runs three times
on a fresh cluster:
  alone        the facility's jobs only: the baseline every delay is measured against;
  preempt      with `parsl-bft run` training alongside on pilots in the preemptable partition (`backfill`:
               a facility job takes a pilot's nodes at once);
  no-preempt   the same, pilots in the facility's own partition (`debug`): no preemption, pilots must fit the
               holes the scheduler's own plan leaves (squeue --start, reservations) and leave when a facility
               job is planned onto their nodes.
Training: two jobs of the EMULATED ACCELERATOR (parsl_bft/train/emulated.py: a sleep stands in for the GPU's
compute, real gloo all-reduces and HDF5 checkpoints; a 1-node step takes 1.0 s, --sample-ms sets it), whose
scaling curve is known exactly, so "samples trained / what the same jobs train on dedicated nodes for the same
node-seconds" is exact.
Then `parsl-bft simulate` replays the alone run's idle nodes with the same jobs under the costs this run
measured, and its e_idle is printed beside the real one.

    python benchmarks/facility_replay.py                        # ~30 min: 3 runs of 8 min
    python benchmarks/facility_replay.py --compression 20 --start 2022-09-27T16:30   # 2 h 40 min of log
    python benchmarks/facility_replay.py --swf ../shared/data/eval/theta_2023H1.swf.gz --start 2023-05-20T20:00
    python benchmarks/facility_replay.py --smoke                # ~7 min: 90-second runs, 20x

Needs root (it starts its own local Slurm under /tmp/local-slurm-replay, ports 19817 and up). Writes
out/facility_replay/ (each run's records and state, the plot facility_replay.png, result.json). LAST lines: one
JSON object per mode.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from facility_stream import JobRecord, LocalSlurm, Replayed, StreamJob, finish, replay, stream_from_swf
from held_time import held_time
from replay_sim import held_spans, idle_intervals, pilot_start_s, simulate
from replay_training import Emulated, Training, read_training

from parsl_bft.execution.errors import StateError
from parsl_bft.execution.jobstore import JobStore

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PARSL_BFT_SHARED", ROOT.parent / "shared"))
GRACE_S = 10.0                  # tools/local-slurm.sh: GraceTime of the preemptable partition
TAU_S = 10.0                    # bounded slowdown's floor on run time (the usual 10 s)
PLAN_TOLERANCE_S = 2.0          # squeue's 1 s resolution + the scheduler's 1 s cycle
MODES = {"preempt": "backfill", "no-preempt": "debug"}
DEFAULT_START, SMOKE_START = "2022-09-27T18:30", "2022-09-27T11:00"
DEFAULT_COMPRESSION, SMOKE_COMPRESSION = 5.0, 20.0

SITE = """name: replay
scheduler: slurm
partition: {partition}
node: {{cores: 4, gpus: 0, ranks_per_node: 1}}
pilot_walltime: {{min_minutes: 1, max_minutes: 30}}
interchange_address: 127.0.0.1
worker_init: "export SLURM_CONF={conf}"
checkpoint_dir: {state}/checkpoints
holes: {{poll_seconds: 1, max_pending_seconds: 20, notice_seconds: 20, max_pilots: {nodes}}}
objective: {{name: throughput, t_fwd_seconds: 20}}
"""
WORKFLOW = """from parsl_bft.execution import TrainingJob, training_session
with training_session("state") as trainer:
    for name in ("emu-a", "emu-b"):
        trainer.submit(TrainingJob(name, workload="emulated", samples=10**12, global_batch={batch}, min_nodes=1,
                                   max_nodes={max_nodes}, rate_guess={rate},
                                   workload_args={{"sample_ms": {sample_ms}, "params_mb": {params_mb}}}))
    trainer.run()
"""


def node_seconds(spans: list[tuple[float, float | None, int]], window_s: float) -> float:
    """Node-seconds of (start, end, nodes) spans within [0, window_s] (an end of None: still running then)."""
    return sum(n * max(0.0, min(window_s if b is None else b, window_s) - max(a, 0.0)) for a, b, n in spans)


def spans(rep: Replayed, pilots: bool) -> list[tuple[float, float | None, int]]:
    recs = rep.pilots() if pilots else list(rep.facility().values())
    return [(r.start, r.end, len(r.nodes)) for r in recs if r.start is not None]


def delays(alone: Replayed, other: Replayed, window_s: float) -> tuple[list[float], int]:
    """Each facility job's start with training minus its start alone (matched by name); a job that started in
    one run only counts as delayed to the window's end (a lower bound), and is counted."""
    a, b = alone.facility(), other.facility()
    out, unmatched = [], 0
    for name, ra in a.items():
        rb = b.get(name)
        sa, sb = ra.start, rb.start if rb is not None else None
        if sa is None and sb is None:
            continue
        if sa is None or sb is None:
            unmatched += 1
        out.append((window_s if sb is None else sb) - (window_s if sa is None else sa))
    return out, unmatched


def bounded_slowdown(rep: Replayed, jobs: dict[str, StreamJob], window_s: float) -> float:
    """Mean bounded slowdown of the facility jobs that started (wait + run) / max(run, TAU_S), at least 1."""
    vals = []
    for name, r in rep.facility().items():
        if r.start is None or name not in jobs:
            continue
        j = jobs[name]
        wait = r.start - j.offset_s
        vals.append(max(1.0, (wait + j.sleep_s) / max(j.sleep_s, TAU_S)))
    return statistics.mean(vals) if vals else 1.0


def plan_violations(rep: Replayed) -> int:
    """Facility jobs that started later than the first start the scheduler planned for them."""
    fac = rep.facility()
    return sum(1 for name, plan in rep.first_plan.items()
               if (r := fac.get(name)) is not None and r.start is not None and r.start > plan + PLAN_TOLERANCE_S)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


# --- the runs ------------------------------------------------------------------------------------------------
def say(msg: str) -> None:
    print(f"[facility_replay {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ticker(label: str, window_s: float):
    last = [-60.0]

    def tick(now: float) -> None:
        if now - last[0] >= 60:
            last[0] = now
            say(f"{label}: {now:.0f} of {window_s:.0f} s")
    return tick


def run_alone(cluster: LocalSlurm, jobs: list[StreamJob], window_s: float, out: Path) -> Replayed:
    cluster.restart()
    cluster.hold()
    rep = finish(cluster, replay(cluster, jobs, window_s, ticker("alone", window_s)))
    (out / "alone").mkdir(parents=True, exist_ok=True)
    (out / "alone" / "replay.json").write_text(json.dumps(asdict(rep)))
    return rep


def run_with_training(cluster: LocalSlurm, jobs: list[StreamJob], window_s: float, mode: str, emu: Emulated,
                      out: Path) -> tuple[Replayed, Training]:
    """The stream with `parsl-bft run` training beside it, started with the stream and stopped (SIGTERM: the
    fragments checkpoint, the pilots are given back) at the window's end."""
    cluster.restart()
    d = out / mode
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    state = d / "state"
    (d / "site.yaml").write_text(SITE.format(partition=MODES[mode], conf=cluster.conf, state=state,
                                             nodes=cluster.nodes))
    (d / "workflow.py").write_text(WORKFLOW.format(batch=emu.batch, max_nodes=emu.max_nodes, rate=emu.rate(),
                                                   sample_ms=emu.sample_ms, params_mb=emu.params_mb))
    env = {**os.environ, "SLURM_CONF": cluster.conf, "PYTHONUNBUFFERED": "1"}
    cli = str(Path(sys.executable).with_name("parsl-bft"))
    # the orchestrator starts while a reservation holds every node, so its own start-up (Parsl, the interchange)
    # is not charged to the stretch: a site runs it long before the holes it soaks
    cluster.hold()
    with open(d / "run.log", "w") as log:
        orch = subprocess.Popen([cli, "run", "workflow.py", "--site", "site.yaml", "--quiet"], cwd=d, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            started(state, orch)
            rep = replay(cluster, jobs, window_s, ticker(mode, window_s))
        finally:
            # SIGTERM, not SIGINT: a process started in the background by a non-interactive shell inherits SIGINT
            # ignored (and Python then installs no handler for it); both take the same orderly path
            orch.send_signal(signal.SIGTERM)
            try:
                orch.wait(timeout=240)
            except subprocess.TimeoutExpired:
                say(f"{mode}: the orchestrator did not stop within 240 s of SIGTERM: killed")
                os.killpg(orch.pid, signal.SIGKILL)
                orch.wait()
    rep = finish(cluster, rep)
    (d / "replay.json").write_text(json.dumps(asdict(rep)))
    return rep, read_training(state, rep.t0, window_s, emu.batch)


def started(state: Path, orch: subprocess.Popen, timeout_s: float = 300.0) -> None:
    """Wait until the orchestrator has started its loop (its first event)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if orch.poll() is not None:
            raise RuntimeError(f"parsl-bft run exited with {orch.returncode} before it started (see run.log)")
        if (state / "state.sqlite").exists():
            try:
                if JobStore(state / "state.sqlite", readonly=True).events("start"):
                    return
            except StateError:          # made, its tables not yet: read again
                pass
        time.sleep(0.5)
    raise RuntimeError(f"ran out of time waiting for parsl-bft run to start ({timeout_s:.0f} s)")


# --- the figures -----------------------------------------------------------------------------------------------
def figures(mode: str, alone: Replayed, rep: Replayed, tr: Training, emu: Emulated, jobs: dict[str, StreamJob],
            nodes: int, window_s: float) -> dict:
    idle = nodes * window_s - node_seconds(spans(alone, pilots=False), window_s)
    held = node_seconds(spans(rep, pilots=True), window_s)
    d, unmatched = delays(alone, rep, window_s)
    rate = emu.rate()
    bsld_alone, bsld = bounded_slowdown(alone, jobs, window_s), bounded_slowdown(rep, jobs, window_s)
    return {
        "mode": mode, "facility_jobs": len(d), "facility_unmatched": unmatched,
        "facility_delay_median_s": statistics.median(d) if d else 0.0,
        "facility_delay_p95_s": percentile(d, 95), "facility_delay_max_s": max(d, default=0.0),
        "facility_delayed_jobs": sum(x > PLAN_TOLERANCE_S for x in d),
        "planned_start_violations": plan_violations(rep), "planned_start_violations_alone": plan_violations(alone),
        "bounded_slowdown_alone": bsld_alone, "bounded_slowdown_with": bsld,
        "bounded_slowdown_ratio": bsld / bsld_alone,
        "idle_node_s_alone": idle, "held_node_s": held, "train_node_s": tr.train_node_s,
        "idle_share_held": held / idle if idle else 0.0,
        "held_training_share": tr.train_node_s / held if held else 0.0,
        "samples": tr.samples, "pilots": len(rep.pilots()), "fragments": len(tr.fragments),
        "fragments_failed": tr.failed,
        "e_used_vs_dedicated": tr.samples / (held * rate) if held else 0.0,
        "real_e_idle": tr.samples / (idle * rate) if idle else 0.0,
        "restart_s": tr.restart_s, "restore_s": tr.restore_s, "rendezvous_s": tr.rendezvous_s, "save_s": tr.save_s,
        "resize_pause_s": tr.pause_s,
    }


def mode_figures(mode: str, alone: Replayed, rep: Replayed, tr: Training, emu: Emulated, jobs: dict[str, StreamJob],
                 nodes: int, window_s: float, d: Path) -> dict:
    """Every figure of one mode (``d``: its folder): the facility's, the training's, where the held node-time
    went, and the simulator's on the alone run's holes and on the held node-time."""
    r = figures(mode, alone, rep, tr, emu, jobs, nodes, window_s)
    r["held_node_s_by_part"] = {k: round(v, 1) for k, v in held_time(rep, d / "state", window_s).items()}
    idle = idle_intervals(alone, nodes, window_s)
    naive = simulate(idle, alone.t0, tr, emu, d / "sim-naive")
    late = pilot_start_s(rep, d / "state", rep.t0)
    e_sim = simulate(idle, alone.t0, tr, emu, d / "sim", late)["e_idle_of_all_idle"]
    # the same on the node-time the pilots held, each from its pilot's start: the runtime against the model,
    # whatever the pilots' own fit to the holes
    warm = pilot_start_s(rep, d / "state", rep.t0, from_hole=False)
    e_held = simulate(held_spans(rep, window_s), rep.t0, tr, emu, d / "sim-held", warm)["e_idle_of_all_idle"]
    r.update({"sim_e_idle_naive": naive["e_idle_of_all_idle"], "pilot_start_s": late, "sim_e_idle": e_sim,
              "sim_gap": abs(r["real_e_idle"] - e_sim) / e_sim if e_sim else None,
              "pilot_warm_s": warm, "sim_e_held": e_held,
              "held_gap": abs(r["e_used_vs_dedicated"] - e_held) / e_held if e_held else None})
    return r


def load_runs(out: Path, modes: list[str], window_s: float, batch: int
              ) -> tuple[Replayed, dict[str, tuple[Replayed, Training]]]:
    """The records an earlier run left in ``out`` (--figures-only)."""
    def replayed(path: Path) -> Replayed:
        d = json.loads(path.read_text())
        return Replayed(**{**d, "records": [JobRecord(**{**r, "nodes": tuple(r["nodes"])}) for r in d["records"]]})
    runs = {}
    for m in modes:
        rep = replayed(out / m / "replay.json")
        runs[m] = (rep, read_training(out / m / "state", rep.t0, window_s, batch))
    return replayed(out / "alone" / "replay.json"), runs


# --- the plot --------------------------------------------------------------------------------------------------
def counts(spans_: list[tuple[float, float | None, int]], grid: list[float], window_s: float) -> list[int]:
    return [sum(n for a, b, n in spans_ if a <= t < (window_s if b is None else b)) for t in grid]


def plot(alone: Replayed, runs: dict[str, tuple[Replayed, Training]], nodes: int, window_s: float, path: Path
         ) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [i * 2.0 for i in range(int(window_s / 2))]
    fig, axes = plt.subplots(len(runs) + 1, 1, figsize=(11, 2.6 * (len(runs) + 1)), sharex=True)
    fac = counts(spans(alone, False), grid, window_s)
    axes[0].stackplot(grid, fac, [nodes - f for f in fac], colors=["#9aa5b1", "#ffffff"], labels=["facility jobs",
                                                                                                   "idle"])
    axes[0].set_title("alone: the facility's jobs")
    for ax, (mode, (rep, tr)) in zip(axes[1:], runs.items()):
        fac = counts(spans(rep, False), grid, window_s)
        held = counts(spans(rep, True), grid, window_s)
        train = counts([(a, b, n) for a, b, n in tr.fragments], grid, window_s)
        train = [min(t, h) for t, h in zip(train, held)]
        idle = [max(0, nodes - f - h) for f, h in zip(fac, held)]
        ax.stackplot(grid, fac, train, [h - t for h, t in zip(held, train)], idle,
                     colors=["#9aa5b1", "#2b8a3e", "#f08c00", "#ffffff"],
                     labels=["facility jobs", "pilots training", "pilots starting / between fragments", "idle"])
        ax.set_title(f"{mode}: with parsl-bft training on pilots (emulated accelerator)")
    for ax in axes:
        ax.set_ylim(0, nodes)
        ax.set_ylabel("nodes")
    axes[-1].set_xlabel("seconds of the replay")
    axes[1 if len(axes) > 1 else 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine(load: float) -> dict:
    """Where and with what the figures were measured."""
    import platform
    from importlib.metadata import version

    slurm = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "slurm-client"], capture_output=True,
                           text=True).stdout.strip()
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "load_5min_before": round(load, 2), "platform": platform.platform(), "python": platform.python_version(),
            "slurm": slurm, **{p: version(p) for p in ("parsl", "torch", "parsl-bft")}}


# --- main ------------------------------------------------------------------------------------------------------
def parse_start(text: str) -> float:
    if text.replace(".", "", 1).isdigit():
        return float(text)
    dt = datetime.fromisoformat(text)
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swf", default=str(SHARED / "data" / "traces" / "theta_2022.swf.gz"))
    ap.add_argument("--start", help="the window's start in the log (ISO date, UTC, or unix s; default "
                    f"{DEFAULT_START}, or {SMOKE_START} with --smoke: about 21%% and 38%% of the replayed "
                    "machine idle)")
    ap.add_argument("--minutes", type=float, default=8.0, help="minutes each run replays (the window is "
                    "minutes x compression of the log)")
    ap.add_argument("--compression", type=float, help="log seconds per replayed second (default "
                    f"{DEFAULT_COMPRESSION:g}, {SMOKE_COMPRESSION:g} with --smoke)")
    ap.add_argument("--nodes", type=int, default=8, help="virtual nodes of the local Slurm (8-16; each pilot "
                    "starts its worker pool on this host's cores)")
    ap.add_argument("--modes", default="preempt,no-preempt")
    ap.add_argument("--out", default=str(ROOT / "out" / "facility_replay"))
    ap.add_argument("--smoke", action="store_true", help="90-second runs (the test suite's)")
    ap.add_argument("--slurm-base", default="/tmp/local-slurm-replay", help="where its local Slurm lives")
    ap.add_argument("--slurm-port", type=int, default=19817, help="its slurmctld's port (slurmd: the next ones)")
    ap.add_argument("--sample-ms", type=float, default=Emulated.sample_ms, help="the emulated accelerator's "
                    f"ms per sample per rank (default %(default)g: a 1-node step takes {Emulated.batch} x that); a "
                    "facility job claiming a pilot's node waits for the step in flight")
    ap.add_argument("--figures-only", action="store_true", help="replay nothing: the figures, simulations and plot "
                    "again from the records an earlier run (same options) left in --out")
    args = ap.parse_args()
    if os.geteuid() != 0 and not args.figures_only:
        sys.exit("facility_replay.py needs root: it starts a local Slurm (tools/local-slurm.sh)")
    minutes = 1.5 if args.smoke else args.minutes
    if args.compression is None:
        args.compression = SMOKE_COMPRESSION if args.smoke else DEFAULT_COMPRESSION
    if not args.sample_ms > 0:
        sys.exit(f"--sample-ms must be positive, not {args.sample_ms:g}")
    if args.compression <= 0:
        sys.exit(f"--compression must be positive, not {args.compression:g}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"--modes: unknown {', '.join(unknown)} (use {', '.join(MODES)})")
    window_s = minutes * 60
    start = parse_start(args.start or (SMOKE_START if args.smoke else DEFAULT_START))
    jobs, info = stream_from_swf(args.swf, start, window_s * args.compression, args.nodes, args.compression)
    if not jobs:
        sys.exit(f"no jobs of {args.swf} in the window from {datetime.fromtimestamp(start, UTC).isoformat()}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say(f"{len(jobs)} facility jobs from {Path(args.swf).name}, {minutes:g} min a run on {args.nodes} nodes, "
        f"{args.compression:g}x; offered load {info.log_load:.2f} (log) -> {info.replay_load:.2f} (replayed)")
    if args.figures_only:       # an earlier run's records: its own jobs, wall time, machine and date stay
        emu = Emulated.load(out / "emulated.json")
        alone, runs = load_runs(out, modes, window_s, emu.batch)
        ran = {k: v for k, v in json.loads((out / "result.json").read_text())[0].items()
               if k in ("wall_s", "date", "cpus", "load_5min_before", "platform", "python", "slurm", "parsl",
                        "torch", "parsl-bft")}
    else:
        # stopped by SIGTERM (timeout, a batch system), it still stops its orchestrator and its Slurm
        signal.signal(signal.SIGTERM, lambda *_: sys.exit("facility_replay.py: stopped by SIGTERM"))
        emu = Emulated(sample_ms=args.sample_ms)
        emu.save(out / "emulated.json")
        cluster = LocalSlurm(args.nodes, args.slurm_base, args.slurm_port)
        load = os.getloadavg()[1]
        t_begin = time.time()
        try:
            alone = run_alone(cluster, jobs, window_s, out)
            runs = {m: run_with_training(cluster, jobs, window_s, m, emu, out) for m in modes}
        finally:
            cluster.clean()
        ran = {"wall_s": time.time() - t_begin, **machine(load)}
    by_name = {j.name: j for j in jobs}
    results = [mode_figures(mode, alone, rep, tr, emu, by_name, args.nodes, window_s, out / mode)
               for mode, (rep, tr) in runs.items()]
    plot(alone, runs, args.nodes, window_s, out / "facility_replay.png")
    common = {"swf": Path(args.swf).name, "window": [datetime.fromtimestamp(t, UTC).isoformat()
                                                      for t in info.window],
              "nodes": args.nodes, "compression": args.compression, "facility_jobs_submitted": len(jobs),
              "offered_load_log": info.log_load, "offered_load_replayed": info.replay_load,
              "workload": emu.describe(), "sample_ms": emu.sample_ms, "step_1_node_s": emu.step_s(), **ran}
    (out / "result.json").write_text(json.dumps([{**common, **r} for r in results], indent=1))
    for r in results:
        say(f"{r['mode']}: facility delay median {r['facility_delay_median_s']:.1f} s, p95 "
            f"{r['facility_delay_p95_s']:.1f} s, max {r['facility_delay_max_s']:.1f} s; planned-start violations "
            f"{r['planned_start_violations']} (alone {r['planned_start_violations_alone']}); bounded slowdown x"
            f"{r['bounded_slowdown_ratio']:.3f}; held {r['idle_share_held']:.1%} of the idle node-time, trained "
            f"{r['held_training_share']:.1%} of it; e_used vs dedicated {r['e_used_vs_dedicated']:.3f}; e_idle real "
            f"{r['real_e_idle']:.3f} / simulated {r['sim_e_idle']:.3f}; on the held node-time real "
            f"{r['e_used_vs_dedicated']:.3f} / simulated {r['sim_e_held']:.3f}")
        held = r["held_node_s"] or 1.0
        say(f"{r['mode']}: the held node-time went to " + ", ".join(
            f"{k} {v / held:.1%}" for k, v in r["held_node_s_by_part"].items()))
    say(f"plot: {out / 'facility_replay.png'}; all figures: {out / 'result.json'}")
    for r in results:
        print(json.dumps({**common, **r}))


if __name__ == "__main__":
    main()
