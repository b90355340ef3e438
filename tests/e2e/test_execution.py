"""The embedded default end to end: real Parsl (HTEX), real fragments, an emulated pool that reclaims nodes."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from parsl_bft.execution.events import Failed
from parsl_bft.execution.jobstore import JobStore
from parsl_bft.execution.pool import EmulatedPool
from parsl_bft.train.checkpoint import CheckpointStore, load_checkpoint
from parsl_bft.train.protocol import JobDir

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    Beside,
    RanOutOfTime,
    assert_nothing_left,
    assert_same,
    assert_same_training,
    break_next_checkpoint_write,
    check_chain,
    finish,
    fragment_path,
    kill_a_rank,
    live_ranks,
    replay_path,
    start_orchestrator,
    term_group,
    wait_for,
    wait_training,
)
from orchestrate import EMULATED_IMG_STEPS  # noqa: E402


def test_emulated_pool_notice_before_leave_and_repeat():
    clock = {"t": 0.0}
    pool = EmulatedPool.pattern(nodes=2, period_s=10.0, cycles=1, notice_s=2.0, repeat=True,
                                clock=lambda: clock["t"])
    pool.start()
    seen = []
    for t in range(0, 25):
        clock["t"] = float(t)
        seen += [(t, e.kind, e.nodes) for e in pool.poll()]
    assert seen[0] == (0, "join", ("node0", "node1"))
    # node0 idle 1/3 of the period: notice 2 s before it leaves at 3.33 s
    assert (2, "notice", ("node0",)) in seen and (4, "leave", ("node0",)) in seen
    assert (5, "notice", ("node1",)) in seen and (7, "leave", ("node1",)) in seen
    assert (10, "join", ("node0", "node1")) in seen          # repeats
    kinds = [k for _, k, n in seen if n == ("node0",)]
    assert kinds[:2] == ["notice", "leave"]



def test_a_run_that_hits_its_time_cap_fails_as_out_of_time_not_as_a_wrong_status():
    """An orchestrated run whose own time cap ended it, or a process still running at the test's deadline, is
    'ran out of time at step ...' (the chaos test's cap once showed up as a job's wrong status instead)."""
    capped = {"summary": {"ended": "timeout", "wall_s": 900.0, "jobs": [{"job": "img", "status": "stopped",
                                                                          "samples": 320}]}, "results": {}}
    p = subprocess.Popen([sys.executable, "-c", f"print({json.dumps(json.dumps(capped))})"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    with pytest.raises(RanOutOfTime, match=r"ran out of time at step: the jobs \(.*time cap.*img"):
        finish(p, timeout=60, what="the jobs")
    p = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    with pytest.raises(RanOutOfTime, match=r"ran out of time at step: the sleeper"):
        finish(p, timeout=0.5, what="the sleeper")
    assert p.poll() is not None


CHAOS_SEED = 20261122


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_chaos_embedded_default_kills_ranks_the_orchestrator_and_checkpoint_writes(tmp_path):
    """A seeded schedule kills, at random moments, a training rank (SIGKILL, no notice), the orchestrator
    (SIGKILL of its process group; then restarted) or the next checkpoint write half-way, on top of the
    emulated pool's own reclaims. Every job finishes with the model of an uninterrupted run, the event log
    shows one unbroken chain of committed steps, and nothing is left running."""
    rng = random.Random(CHAOS_SEED)
    state, chaos_log = tmp_path / "state", tmp_path / "chaos"
    chaos_log.mkdir()
    env = {"PARSL_BFT_CHAOS_ARM": str(chaos_log)}
    faults = {"rank": 0, "orchestrator": 0}
    schedule = ["rank"] * 3 + ["orchestrator"] + ["checkpoint write"] * 2
    rng.shuffle(schedule)
    p = start_orchestrator(state, timeout=900, env=env)      # the timeout only stops a hung run
    with Beside(*[("reference_model", tmp_path / f"ref-{n}", n, EMULATED_IMG_STEPS) for n in ("img", "lm")]) as refs:
        for kind in schedule:
            # a random moment while something trains (seeded: after 1-8 progress reports)
            try:
                wait_for(lambda: live_ranks(state) or p.poll() is not None, timeout=300)
            except AssertionError:
                break
            if p.poll() is not None:
                break                                    # everything finished before the schedule did
            wait_training(state, rng.randint(1, 8))
            if kind == "rank":
                faults["rank"] += kill_a_rank(state, rng)
            elif kind == "checkpoint write":
                break_next_checkpoint_write(chaos_log, p)
            elif kind == "orchestrator" and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                faults["orchestrator"] += 1
                p = start_orchestrator(state, timeout=900, env=env)
        finish(p, timeout=1000, what="the jobs finishing under chaos (each orchestrator life's budget: 900 s)")
        refs.wait()
    faults["checkpoint write"] = len(list(chaos_log.glob("save_optimizer.fired-*")))
    print(f"faults injected: {faults}")
    assert faults["rank"] >= 2 and faults["orchestrator"] == 1 and faults["checkpoint write"] >= 1, faults

    db = JobStore(state / "state.sqlite")
    rows = db.jobs()
    assert {n: r.status for n, r in rows.items()} == {"img": "done", "lm": "done"}
    assert rows["img"].samples_done == 32 * EMULATED_IMG_STEPS and rows["lm"].samples_done == 16 * 200
    assert len(db.events("start")) >= faults["orchestrator"] + 1          # every life left its mark
    failed = db.events("fragment-failed")
    assert sum(d["without_notice"] for _, _, d in failed) >= faults["rank"] // 2, failed[:3]
    for name, steps in (("img", EMULATED_IMG_STEPS), ("lm", 200)):
        check_chain(db, name, steps)
        final = CheckpointStore(state / "jobs" / name).latest()
        ref = CheckpointStore(tmp_path / f"ref-{name}").latest()
        assert final.step == steps
        if name == "img":        # always 1 rank: bit for bit
            assert all(torch.equal(final.model[k], ref.model[k]) for k in ref.model)
        else:                    # lm's world size changed between fragments (AdamW)
            assert_same_training(final, ref, steps)
    assert_nothing_left(state, 120)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_killed_without_notice_loses_at_most_one_checkpoint_interval(tmp_path):
    """img trains alone on a node that stays idle; once its fragment has saved periodically, one of its ranks
    is SIGKILLed (no notice). The event log shows the loss, the work at risk was at most one checkpoint
    interval (plus one progress report), and the next fragment resumed from that periodic save."""
    state = tmp_path / "state"
    p = start_orchestrator(state, timeout=600, mode="steady", img_steps=3_000)
    try:
        def periodic_save():           # the running fragment has saved on its own: its ranks, or None
            if not (state / "state.sqlite").exists():
                return None
            launches = JobStore(state / "state.sqlite").events("launch")
            pr = JobDir(state / "jobs" / "img").progress()
            saved = launches and pr is not None and pr.t > launches[-1][0] \
                and pr.saved_step > launches[-1][2]["resume_step"]
            return live_ranks(state) if saved else None
        pids = wait_for(periodic_save, timeout=300)
        os.kill(pids[0], signal.SIGKILL)
        out = finish(p)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    db = JobStore(state / "state.sqlite")
    assert db.jobs()["img"].status == "done" and out["results"]["img"]
    (_, _, lost), = [e for e in db.events("fragment-failed")]
    assert lost["without_notice"] and not lost["reclaimed"]
    assert lost["saved_step"] > lost["resume_step"]           # a periodic save happened before the kill ...
    # ... at most one interval before the last progress report (+0.5 s: reports come every 0.5 s, +0.5 s: a
    # save happens at the end of the first step after the interval; an img step takes milliseconds)
    assert lost["lost_s"] <= lost["checkpoint_every_s"] + 1.0, lost
    launches = [d for _, _, d in db.events("launch")]
    assert launches[1]["resume_step"] == lost["saved_step"]    # and the next fragment resumed from it
    check_chain(db, "img", 3_000)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_job_reclaimed_at_one_site_finishes_at_the_other_from_its_checkpoint(tmp_path):
    """Two sites, one executor each; site a is reclaimed for good; the job's checkpoint is staged to site b."""
    state = tmp_path / "state"
    with Beside(("reference_model", tmp_path / "ref", "img", 2000, 2)) as ref:
        p = subprocess.run([sys.executable, str(HERE / "orchestrate.py"), str(state), "600", "two-sites", "2000"],
                           capture_output=True, text=True, timeout=650)
        assert p.returncode == 0, p.stderr[-3000:]
        ref.wait()
    out = json.loads(p.stdout.strip().splitlines()[-1])
    db = JobStore(state / "state.sqlite")
    assert db.jobs()["img"].status == "done"
    sites = [d.get("site") for _, _, d in db.events("launch")]
    assert sites[0] == "a" and sites[-1] == "b", sites
    (_, _, stage), = db.events("stage")
    moved = CheckpointStore(state / "sites" / "b" / "jobs" / "img").paths()
    assert stage["to"] == "b" and Path(stage["checkpoint"]).parent == state / "sites" / "b" / "jobs" / "img"
    staged_step = int(Path(stage["checkpoint"]).stem.split("-")[1])
    assert staged_step > 0, "the job trained at site a before it moved"
    final = CheckpointStore(Path(out["results"]["img"]).parent).latest()
    assert Path(out["results"]["img"]).parent == moved[0].parent and final.step == 2000
    # every fragment ran on 2 ranks (both sites have 2 nodes): then resuming is exact, bit for bit
    assert {m["world"] for m in final.metrics} == {2}
    ref = CheckpointStore(tmp_path / "ref").latest().model
    assert all(torch.equal(final.model[k], ref[k]) for k in ref)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_runs_a_workflow_on_two_sites(tmp_path):
    """`parsl-bft run WORKFLOW --site A --site B`: one executor per site, the multi-site planner, a trained model."""
    root = HERE.parent
    b = tmp_path / "b.yaml"
    b.write_text((root / "site_configs" / "local.yaml").read_text().replace("name: local", "name: local-b"))
    p = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "run", str(root / "workflows" / "language_model.py"),
                        "--site", str(root / "site_configs" / "local.yaml"), "--site", str(b)],
                       capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "sites: local, local-b" in p.stdout
    final = tmp_path / p.stdout.strip().splitlines()[-1]
    assert final.exists() and CheckpointStore(final.parent).latest().samples_done >= 8_000
    db = JobStore(tmp_path / "bft-state" / "language_model" / "state.sqlite")
    assert {d["site"] for _, _, d in db.events("launch")} <= {"local", "local-b"}
    assert final.parent.parent.parent.parent.name == "sites"          # .../sites/<site>/jobs/my-lm/ckpt-*.h5
    bad = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "run", str(root / "workflows" / "language_model.py"),
                          "--site", str(tmp_path / "missing.yaml")], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "missing.yaml: no such site file" in bad.stderr


def test_site_weights_reach_the_planner_by_job_name(tmp_path):
    from parsl_bft.execution.orchestrator import Orchestrator, TrainingJob
    orch = Orchestrator(tmp_path / "s", EmulatedPool.pattern(nodes=1, period_s=10.0, cycles=1), planner=None,
                        weights={"a": 5.0})
    orch.submit(TrainingJob("a"))
    orch.submit(TrainingJob("b", weight=2.0))
    assert {s.name: s.weight for s in orch.pending_specs()} == {"a": 5.0, "b": 2.0}


STEADY_SITE = """name: steady
scheduler: local
node: {{cores: 3, gpus: 0}}
objective: {{name: throughput, t_fwd_seconds: 20}}
emulation: {{trace: {trace}, speedup: 1, notice_seconds: 2}}
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_futures_resolve_on_their_own_and_feed_parsl_apps(tmp_path, monkeypatch):
    """A session's loop runs in the background: a job's future resolves without run(), a Parsl app that takes it
    as input runs after it, and a job submitted once the first is done joins the running plan."""
    from parsl import python_app
    # the workers import this module by name to unpickle the apps defined below
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))

    from parsl_bft.execution import TrainingJob, training_session
    from parsl_bft.execution.orchestrator import RunStopped
    trace = tmp_path / "idle.csv"
    trace.write_text("node,idle_start,idle_end\nn1,0,1000000\n")
    site = tmp_path / "steady.yaml"
    site.write_text(STEADY_SITE.format(trace=trace))

    @python_app
    def steps_of(checkpoint):                   # a user's downstream app: reads the trained model's checkpoint
        from parsl_bft.train.checkpoint import load_checkpoint
        return load_checkpoint(checkpoint).step

    @python_app(executors=["login"])
    def here():                                 # an app that must not run on a pilot: the session's login executor
        return os.getpid()

    job = dict(workload="images", global_batch=32, max_nodes=1, workload_args={"n": 256}, rate_guess=3000.0)
    with training_session(tmp_path / "state", str(site)) as trainer:
        assert here().result(timeout=60) == os.getpid()
        first = trainer.submit(TrainingJob("a", samples=32 * 60, **job))
        assert steps_of(first).result(timeout=300) == 60
        second = trainer.submit(TrainingJob("b", samples=32 * 40, **job))
        assert CheckpointStore(Path(second.result(timeout=300)).parent).latest().step == 40
        never = trainer.submit(TrainingJob("c", samples=32 * 10_000_000, **job))
    with pytest.raises(RunStopped, match="not done when the run stopped"):    # nothing waits forever on it
        never.result(timeout=60)
    db = JobStore(tmp_path / "state" / "state.sqlite")
    assert "b" in [d["job"] for _, _, d in db.events("submit")]             # joined the running loop
    assert db.jobs()["c"].status != "done" and db.events("stop")[-1][2]["why"] == "stopped"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_digits_sweep_a_parsl_pipeline_of_futures_reaches_its_accuracy(tmp_path):
    """workflows/digits_sweep.py as a user runs it: prepare -> 4 training jobs whose data is the prepare app's
    future -> an evaluation app per trained model -> the best; held-out accuracy >= 0.9 (the workflow asserts
    it too), every job's model trained to its exact step count."""
    workflow = HERE.parent / "workflows" / "digits_sweep.py"
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "run", str(workflow)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=850)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["configs"] >= 4 and out["best_accuracy"] >= 0.9 and len(out["accuracy"]) == out["configs"]
    # `run`'s progress: plain lines, stderr being no terminal here; the last one per job says done
    ends = [line for line in r.stderr.splitlines() if line.startswith("parsl-bft ") and ": 100.0% of" in line
            and ", done" in line]
    assert sorted(line.split()[2].rstrip(":") for line in ends) == sorted(out["accuracy"]), r.stderr[-2000:]
    db = JobStore(tmp_path / "bft-state" / "digits" / "state.sqlite")
    assert {r.status for r in db.jobs().values()} == {"done"}
    assert all(CheckpointStore(tmp_path / "bft-state" / "digits" / "jobs" / n).latest().step == -(-1437 * 15 // 64)
               for n in db.jobs())


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["SIGTERM to the process", "Ctrl-C to the process group"])
def test_one_signal_to_parsl_bft_run_checkpoints_and_leaves_nothing_behind(tmp_path, how):
    """SIGTERM once to `parsl-bft run` mid-training, or a terminal's Ctrl-C (SIGINT to every process of the
    foreground group: interchange, worker pool and ranks included): the fragments save a checkpoint newer than
    the signal, the run exits at once, and no process of it (interchange, worker pool, ranks) is left."""
    workflow = HERE.parent / "workflows" / "image_classifier.py"
    # as a terminal starts it: a suite started in the background by a non-interactive shell passes SIGINT on
    # ignored, and a process that inherits it so never sees a Ctrl-C
    p = subprocess.Popen([sys.executable, "-m", "parsl_bft.cli", "run", str(workflow)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    state = tmp_path / "bft-state" / "image_classifier"
    try:
        wait_for(lambda: live_ranks(state) and any(JobDir(d).progress() for d in state.glob("jobs/*")), timeout=300)
        t_signal = time.time()
        if how.startswith("Ctrl-C"):
            os.killpg(p.pid, signal.SIGINT)
        else:
            p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0 and "Traceback" not in err, err[-2000:]
    newest = max(f.stat().st_mtime for f in state.glob("jobs/*/ckpt-*.h5"))
    assert newest > t_signal                                   # the shutdown checkpoint
    stop = JobStore(state / "state.sqlite").events("stop")[-1][2]
    ctrl_c = how.startswith("Ctrl-C")
    assert stop["why"] == ("interrupted" if ctrl_c else "SIGTERM"), stop     # the session says why it unwound
    status = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "status", str(state)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLUMNS": "300"}).stdout
    assert ("stopped: interrupted (Ctrl-C)" if ctrl_c else "stopped: terminated (SIGTERM)") in status, status
    assert_nothing_left(state, 60)


def _interchanges(pid: int) -> list[int]:
    """The interchanges of orchestrator ``pid``: the processes below it that Parsl names its interchange."""
    rows = [line.split(None, 2) for line in subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True,
                                                           text=True).stdout.splitlines()[1:]]
    below, grew = {str(pid)}, True
    while grew:
        more = {r[0] for r in rows if len(r) == 3 and r[1] in below} - below
        below, grew = below | more, bool(more)
    return [int(r[0]) for r in rows if len(r) == 3 and r[0] in below and "HTEX interchange" in r[2]]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("first", ["nothing", "the interchange dies"])
def test_one_sigterm_to_the_process_group_ends_the_run_within_the_notice(tmp_path, first):
    """`kill -TERM -- -PGID` (what `timeout`, systemd and a batch system send) once to `parsl-bft run` on the
    embedded default, mid-training - also after its interchange died: the run ends within the notice time (plus
    a margin for a loaded machine) with the fragments' checkpoints saved, and nothing of it is left. It used to
    hang until SIGKILL: the interchange, in the same group, died first and Parsl's cleanup waited on it."""
    from parsl_bft.sites import DEFAULT_SITE, load_site
    notice = (load_site(DEFAULT_SITE).emulation.notice_seconds if load_site(DEFAULT_SITE).emulation else 2.0)
    workflow = HERE.parent / "workflows" / "image_classifier.py"
    p = subprocess.Popen([sys.executable, "-m", "parsl_bft.cli", "run", "--quiet", str(workflow)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    state = tmp_path / "bft-state" / "image_classifier"
    try:
        wait_for(lambda: live_ranks(state) and any(JobDir(d).progress() for d in state.glob("jobs/*")), timeout=300,
                 what="training")
        if first != "nothing":
            (ic,) = _interchanges(p.pid)
            os.kill(ic, signal.SIGKILL)
            wait_for(lambda: not _interchanges(p.pid), 30, 0.05, what="the interchange's end")
        t_signal, err = term_group(p, notice + 20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    newest = max(f.stat().st_mtime for f in state.glob("jobs/*/ckpt-*.h5"))
    assert newest > t_signal                                   # the shutdown checkpoint
    assert JobStore(state / "state.sqlite").events("stop")[-1][2]["why"] in ("SIGTERM", "stopped")
    assert_nothing_left(state, 60)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_killed_outright_leaves_nothing_behind_and_resumes(tmp_path):
    """`kill -9` of `parsl-bft run` alone (no signal to anything else) on the embedded default: its interchange
    dies with it, the worker pool loses it and exits, the ranks die with their workers - nothing trains on for
    nobody. Run again, the job resumes from its newest good checkpoint."""
    workflow = HERE.parent / "workflows" / "image_classifier.py"
    state = tmp_path / "bft-state" / "image_classifier"

    def start():
        return subprocess.Popen([sys.executable, "-m", "parsl_bft.cli", "run", str(workflow)], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    p = start()
    try:
        wait_for(lambda: live_ranks(state) and list(state.glob("jobs/*/ckpt-*.h5")), timeout=300,
                 what="training with a checkpoint")
        p.kill()
        p.wait()
        assert_nothing_left(state, 120)
        saved = {d.name: CheckpointStore(d).latest(arrays=False).step for d in state.glob("jobs/*")
                 if CheckpointStore(d).latest(arrays=False) is not None}
        again = start()
        db = JobStore(state / "state.sqlite")

        def relaunched():       # each saved job's first launch in the second run: the step it resumed from
            second = db.events("start")[1:2]
            first = {}
            for t, _, d in db.events("launch"):
                if second and t >= second[0][0]:
                    first.setdefault(d["job"], d["resume_step"])
            return first if set(saved) <= set(first) else None
        resumed = wait_for(relaunched, timeout=300, what="the second run's launches")
    finally:
        for q in [p, *([again] if "again" in locals() else [])]:
            if q.poll() is None:
                os.killpg(q.pid, signal.SIGKILL)
                q.wait()
    assert saved and all(resumed[n] >= step > 0 for n, step in saved.items()), (saved, resumed)
    assert_nothing_left(state, 120)


def _descendants(pid: int) -> list[tuple[int, str]]:
    """Every process below ``pid`` with its command line (from /proc)."""
    parent, args = {}, {}
    for d in Path("/proc").iterdir():
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (ValueError, OSError, IndexError):
            continue
    below, todo = [], [pid]
    while todo:
        up = todo.pop()
        kids = [c for c, pp in parent.items() if pp == up]
        below += kids
        todo += kids
    return [(c, args[c]) for c in below]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_dead_interchange_stops_the_run_with_the_reason(tmp_path):
    """The interchange killed: `status` kept saying "running on 3 node(s)" with no progress and no error. Now the
    run stops at the loop's next turn, saying so (exit 2), and nothing of it is left."""
    workflow = HERE.parent / "workflows" / "image_classifier.py"
    state = tmp_path / "bft-state" / "image_classifier"
    p = subprocess.Popen([sys.executable, "-m", "parsl_bft.cli", "run", str(workflow)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: live_ranks(state), timeout=300, what="training")
        below = _descendants(p.pid)
        interchange = next((pid for pid, args in below           # it renames itself: "parsl: HTEX interchange"
                            if "interchange" in args and "die_with_parent" not in args), None)
        assert interchange is not None, below
        os.kill(interchange, signal.SIGKILL)
        _, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 2, err[-3000:]
    assert "the Parsl interchange (process" in err and "ended (exit status 137)" in err, err[-3000:]
    assert_nothing_left(state, 120)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_demo_runs_to_its_table_plot_and_json(tmp_path):
    """The README's first command, with two small jobs: live table, final table, plot and JSON."""
    import io

    from rich.console import Console

    from parsl_bft.execution.demo import run_demo
    jobs = [dict(name=n, workload="images", samples=32 * 150, max_nodes=2, global_batch=32,
                 workload_args={"n": 256}, rate_guess=3000.0) for n in ("small", "other")]
    import gc
    import warnings
    text = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        summary = run_demo(tmp_path, console=Console(file=text, width=120), warm_up=False, jobs=jobs)
        gc.collect()
    assert not [w for w in caught if "unclosed file" in str(w.message)], [str(w.message) for w in caught]
    assert {r.job: r.status for r in summary.jobs} == {"small": "done", "other": "done"}
    assert all(0 < r.e_used <= 1 and r.ref_rate.per_node_s > 0 for r in summary.jobs), summary.jobs
    assert (tmp_path / "demo.png").stat().st_size > 0 and "final_checkpoints" in (tmp_path / "demo.json").read_text()
    out = text.getvalue()
    assert "demo finished" in out and "small: ckpt-000000150.h5" in out and "samples/s per node" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_users_own_training_loop_trains_on_idle_nodes_like_the_same_fragments_replayed(tmp_path):
    """workflows/digits_loop.py's train(ctx), unchanged, as a job on the embedded default: a second node joins
    (the job grows), a notice stops a fragment half-way. What is invariant whatever the timing: the final model is,
    bit for bit, the one of the same function trained outside the orchestrator along the same path of fragments
    (the ranks and step boundaries of each, read from the event log). An uninterrupted run is not: a change of
    world size reorders float sums, and that drift grows with the steps after it (0.05 after a 1 -> 2 rescale at
    step 1, 1e-6 on two ranks throughout), so where the rescale lands decides any bound against it. The workflow
    had loaded its own Parsl config: the session joins that DataFlowKernel (no "Config has already been
    loaded"), the user's app on the user's own executor takes the job's future, and the user's DataFlowKernel
    lives on after the session."""
    import parsl
    from parsl import python_app
    from parsl.config import Config
    from parsl.executors import ThreadPoolExecutor

    from parsl_bft.execution import TrainingJob, training_session
    loop = str(HERE.parent / "workflows" / "digits_loop.py") + ":train"
    steps = 1200
    trace = tmp_path / "idle.csv"
    trace.write_text("node,idle_start,idle_end\nn1,0,1000000\nn2,2,1000000\n")
    site = tmp_path / "steady.yaml"
    site.write_text(STEADY_SITE.format(trace=trace))

    @python_app(executors=["mine"])
    def steps_of(checkpoint):
        from parsl_bft.train.checkpoint import load_checkpoint
        return load_checkpoint(checkpoint).step

    with parsl.load(Config(executors=[ThreadPoolExecutor(label="mine")], run_dir=str(tmp_path / "runinfo"))) as dfk:
        with training_session(tmp_path / "state", str(site)) as trainer:
            assert {"mine", "bft_steady"} <= set(dfk.executors)
            fut = trainer.submit(TrainingJob("mine", loop=loop, samples=64 * steps, global_batch=64, max_nodes=2,
                                             rate_guess=20_000.0, t_up=1.0, t_down=1.0))
            jd = JobDir(trainer.job_dir("mine"))
            wait_for(lambda: fut.done() or ((p := jd.progress()) is not None and p.step >= 100),
                     what="the job's first 100 steps")
            jd.request_stop()                                      # as a reclaim notice does
            assert steps_of(fut).result(timeout=500) == steps
            final = load_checkpoint(fut.result())                  # the future: the final checkpoint's path
        assert steps_of(fut.result()).result(timeout=60) == steps  # the user's DataFlowKernel lives on
        with pytest.raises(ValueError, match=r"already loaded has executor\(s\) \[.bft_steady.\]"), \
                training_session(tmp_path / "state2", str(site)):
            pass
    db = JobStore(tmp_path / "state" / "state.sqlite")
    check_chain(db, "mine", steps)
    assert len(db.events("launch")) >= 2                       # the notice ended a fragment, the job resumed
    path = fragment_path(db, "mine")
    assert len(path) >= 2 and path[-1][2] == steps, path
    replay_path(path, tmp_path / "replay", job="mine", workload="unused", loop=loop, global_batch=64,
                total_samples=64 * steps, fsync=False)
    want = CheckpointStore(tmp_path / "replay").latest()
    assert final.step == want.step == steps
    assert_same(final.model, want.model)


def test_status_reads_live_progress_and_shows_a_failed_jobs_traceback(tmp_path, capsys, monkeypatch):
    """`parsl-bft status` between fragment ends: the running fragment's own report (83 %, not the 0 % the
    database holds until the fragment ends), and the whole traceback of a job that failed."""
    from parsl_bft.cli import main
    from parsl_bft.train.protocol import Progress
    monkeypatch.setenv("COLUMNS", "250")
    state = tmp_path / "state"
    state.mkdir()
    db = JobStore(state / "state.sqlite")
    for name in ("train", "broken"):
        db.add(name, {"name": name, "samples": 1000})
    db.update("train", status="running", size=2)
    JobDir(state / "jobs" / "train").ensure().write_progress(Progress(13, 832, 0.25, 2, 10, time.time(), time.time()))
    db.update("broken", status="failed")
    db.record(Failed("broken", "rank 1 on h failed first: ValueError: lr 10 is too large\n"
                               "Traceback (most recent call last):\n  File \"user.py\", line 2, in check"))
    db.close()
    assert main(["status", str(state)]) == 0
    out = capsys.readouterr().out
    assert "83.2% of 1,000, loss 0.25" in out
    assert "broken failed: rank 1 on h failed first: ValueError: lr 10 is too large" in out and "in check" in out


def test_a_changed_spec_says_what_changed_and_how_to_start_afresh(tmp_path):
    from parsl_bft.execution.orchestrator import Orchestrator, TrainingJob
    from parsl_bft.execution.session import set_aside
    orch = Orchestrator(tmp_path / "s", EmulatedPool.pattern(nodes=1, period_s=10.0, cycles=1), planner=None)
    orch.submit(TrainingJob("a", samples=100))
    with pytest.raises(ValueError, match=r"another spec \(samples 100 -> 200\).*--new-run"):
        orch.submit(TrainingJob("a", samples=200))
    with pytest.raises(Exception, match="in use by another orchestrator"):
        set_aside(tmp_path / "s")                                  # not while it runs
    orch.close()
    old = set_aside(tmp_path / "s")
    assert (old / "state.sqlite").exists() and not (tmp_path / "s").exists()
    with pytest.raises(ValueError, match="no such file"):
        TrainingJob("b", loop="missing.py:train")


def test_workload_args_that_are_not_json_name_the_field(tmp_path):
    from parsl_bft.execution.orchestrator import Orchestrator, TrainingJob
    orch = Orchestrator(tmp_path / "s", EmulatedPool.pattern(nodes=1, period_s=10.0, cycles=1), planner=None)
    with pytest.raises(ValueError, match=r"workload_args\['data'\] is a PosixPath.*pass str\(path\)"):
        orch.submit(TrainingJob("a", workload_args={"data": tmp_path, "n": 1}))
    with pytest.raises(ValueError, match=r"workload_args\['lr'\] is a float, not a JSON value"):
        orch.submit(TrainingJob("a", workload_args={"lr": float("nan")}))
    with pytest.raises(ValueError, match=r"workload 'imgaes': write 'images' or 'lm' or 'emulated', "
                                         r"'package.module:factory'"):
        orch.submit(TrainingJob("a", workload="imgaes"))          # a typo: at submit, not later in a rank
    with pytest.raises(ValueError, match=r"workload 'missing.py:Model': no such file missing.py"):
        orch.submit(TrainingJob("a", workload="missing.py:Model"))
    assert orch.jobs == {}                                     # nothing half-declared
