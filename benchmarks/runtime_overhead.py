"""Runtime overhead: how long from "the plan gives a job nodes" to "a fragment trains on them", the share of
held node-time spent training (goal: > 90 %), and - on a real Slurm - what the scheduler sees and what a loss
without notice costs.

    python benchmarks/runtime_overhead.py           # embedded default: the demo, cold workers vs warmed up
    python benchmarks/runtime_overhead.py --slurm   # the local 8-node Slurm (root; tools/local-slurm.sh)

Embedded default: runs the demo (3 jobs, emulated Theta pool, 30x) twice in this process - workers cold (the
baseline), then warmed up before the pool starts - and prints the ratios. Slurm: a facility job leaves 4 of 8
nodes idle; img trains on pilots of 2-minute walltime (so fresh pilots keep arriving) for ~5 minutes, and one
pilot under a rank is killed outright (scancel --signal=KILL) half-way. Printed: scheduler commands per minute
(goal: independent of the number of pilots; the stated budget is 2 per poll cycle + 1 a minute), launch ->
training on fresh pilots (goal <= 2 s), held node-time spent training (goal >= 90 %), work lost to the kill
(goal <= one checkpoint interval). LAST line: one JSON object.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console

from parsl_bft.execution.demo import run_demo
from parsl_bft.execution.jobstore import JobStore
from parsl_bft.execution.statedir import DATABASE


def measure(warm_up: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        summary = run_demo(d, console=Console(quiet=True), warm_up=warm_up)
        db = JobStore(Path(d) / "state" / DATABASE)
        lat = [e["train_started"] - e["launched"] for _, _, e in db.events("fragment-done")]
    return {"fragments": len(lat), "launch_to_training_p50_s": statistics.median(lat) if lat else None,
            "launch_to_training_max_s": max(lat) if lat else None, "train_share": summary.train_share,
            "wall_s": summary.wall_s, "warm_up_s": summary.warm_up_s}


ROOT = Path(__file__).resolve().parent.parent
SLURM_SITE = """name: bench-slurm
scheduler: slurm
partition: backfill
node: {{cores: 4, gpus: 0, ranks_per_node: 2}}
pilot_walltime: {{min_minutes: 1, max_minutes: 3}}
interchange_address: 127.0.0.1
worker_init: "export SLURM_CONF={conf}"
checkpoint_dir: {state}/checkpoints
holes: {{poll_seconds: 5, max_pending_seconds: 20, notice_seconds: 20, max_pilots: 4}}
objective: {{name: throughput, t_fwd_seconds: 20}}
"""


def _kill_a_pilot_under_a_rank(state: Path, after_s: float, killed: list) -> None:
    """After ``after_s``, once the running fragment has saved periodically and trained on since: scancel
    --signal=KILL a pilot whose node runs one of its ranks (pid files name the node) and that has no notice
    yet (no mark; its USR1 notice may come up to 60 s early here): a loss without notice."""
    from parsl_bft.execution.jobstore import JobStore
    from parsl_bft.train.protocol import JobDir

    time.sleep(after_s)
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    db = JobStore(state / DATABASE, readonly=True)
    for _ in range(600):
        time.sleep(0.5)
        launches = db.events("launch")
        pr = JobDir(state / "checkpoints" / "img").progress()
        if not launches or pr is None or pr.t < launches[-1][0] or pr.saved_at < launches[-1][0] \
                or pr.step <= pr.saved_step:
            continue
        for f in state.glob("**/.ranks-*.pid"):
            try:
                node = json.loads(f.read_text())["node"]
            except (OSError, ValueError, KeyError):
                continue
            out = subprocess.run(["squeue", "-h", "-p", "backfill", "-t", "R", "-w", node, "-o", "%i|%e"],
                                 capture_output=True, text=True, env=env).stdout.split()
            for jid, end in (line.split("|") for line in out):
                if not list(state.glob(f"runinfo/*/submit_scripts/{jid}.noticed")) and int(end) - time.time() > 90:
                    subprocess.run(["scancel", "--signal=KILL", "--full", jid], check=False)
                    killed.append((time.time(), jid, node))
                    return


def measure_slurm(run_s: float = 300.0) -> dict:
    from parsl_bft.execution import TrainingJob
    from parsl_bft.execution.session import training_session

    if os.geteuid() != 0:
        sys.exit("--slurm needs root: it starts the local Slurm (tools/local-slurm.sh)")
    env = {**os.environ, "SLURM_LOCAL_FRESH": "1", "SLURM_LOCAL_AUTH": "none"}
    subprocess.run([str(ROOT / "tools" / "local-slurm.sh"), "restart"], env=env, check=True, capture_output=True)
    os.environ["SLURM_CONF"] = "/tmp/local-slurm/etc/slurm.conf"
    facility = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-N", "4", "-t", "10", "-o", "/dev/null",
                               "--wrap", "sleep 600"], capture_output=True, text=True, check=True).stdout.strip()
    d = ROOT / "out" / "runtime_overhead_slurm"          # kept: the event log says where the time went
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    state = Path(d) / "state"
    site = Path(d) / "site.yaml"
    site.write_text(SLURM_SITE.format(conf=os.environ["SLURM_CONF"], state=state))
    killed: list = []
    job = TrainingJob("img", workload="images", samples=32 * 10_000_000, global_batch=32, min_nodes=1,
                      max_nodes=4, workload_args={"n": 512})
    try:
        with training_session(state, str(site)) as orch:
            orch.submit(job)
            threading.Thread(target=_kill_a_pilot_under_a_rank, args=(state, run_s / 2, killed),
                             daemon=True).start()
            t0 = time.monotonic()
            summary = orch.run(timeout_s=run_s)
            wall = time.monotonic() - t0
            calls = orch.pool.provider.cmd.per_minute(window_s=wall)
            pilots = len(orch.pool.provider.submitted)
            events = orch.db.events()
    finally:
        subprocess.run(["scancel", facility], capture_output=True)
        subprocess.run(["scancel", "--user", "root"], capture_output=True)
    done = [e for _, kind, e in events if kind == "fragment-done"]
    lat = [e["train_started"] - e["launched"] for e in done]
    # every fragment that died rather than stopped (a pilot killed outright may still signal its batch script
    # a moment before: the orchestrator then sees a notice it had no time to act on)
    lost = [e for _, kind, e in events if kind == "fragment-failed"]
    queries = {k: v for k, v in calls.items() if k in ("sinfo", "squeue", "scontrol", "sacct", "sacctmgr")}
    return {"wall_s": wall, "pilots": pilots, "fragments": len(done),
            "commands_per_min": sum(calls.values()), "queries_per_min": sum(queries.values()),
            "by_command_per_min": {k: round(v, 1) for k, v in sorted(calls.items())},
            "launch_to_training_p50_s": statistics.median(lat) if lat else None,
            "launch_to_training_max_s": max(lat) if lat else None,
            "train_share": summary.train_share,
            "pilot_time_training": (sum(r.train_node_s for r in summary.jobs) / summary.pool_node_s
                                    if summary.pool_node_s else 0.0),
            "killed": len(killed), "fragments_lost": len(lost),
            "lost_s": [e.get("lost_s") for e in lost], "checkpoint_every_s": [e["checkpoint_every_s"] for e in lost]}


def main_slurm() -> None:
    r = measure_slurm()
    print(f"local Slurm, {r['wall_s']:.0f} s, {r['pilots']} pilots, {r['fragments']} fragments")
    print(f"  scheduler commands: {r['commands_per_min']:.1f}/min ({r['queries_per_min']:.1f} queries/min; budget "
          f"{2 * 60 / 5 + 1:.0f} queries/min at poll_seconds 5) {r['by_command_per_min']}")
    print(f"  launch -> training p50 {r['launch_to_training_p50_s']:.2f} s, max {r['launch_to_training_max_s']:.2f} s "
          "(goal <= 2 s)")
    print(f"  held node-time spent training {r['train_share']:.1%} (goal >= 90 %); pilot node-time spent training "
          f"{r['pilot_time_training']:.1%}")
    for lost, every in zip(r["lost_s"], r["checkpoint_every_s"]):
        print(f"  fragment lost (pilot killed): {lost} s of training since its last save, checkpoint interval "
              f"{every} s (ratio {lost / every:.2f}; goal <= 1)" if lost is not None else
              "  fragment lost (pilot killed) before it reported any progress: only its start-up was lost")
    print(json.dumps(r))


def main() -> None:
    if "--slurm" in sys.argv[1:]:
        return main_slurm()
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
