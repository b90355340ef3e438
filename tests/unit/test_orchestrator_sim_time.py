"""The orchestrator's loop on simulated time: a scripted idle pool and fragments that 'train' at a fixed rate per
node (no Parsl, no torch ranks), driven by an injected SimulatedClock. The decisions are the real orchestrator's:
planning, launching, stop requests on a reclaim notice, collecting, crash-loop accounting, the event log."""
from __future__ import annotations

import os
import signal
import time

import pytest
from simulated import RATE, ScriptedPool, SimulatedFragments, _orchestrator

from parsl_bft.execution.clock import SimulatedClock
from parsl_bft.execution.errors import JobFailed
from parsl_bft.execution.orchestrator import TrainingJob


def test_a_notice_stops_the_fragment_on_that_node_and_the_jobs_finish_on_what_is_left(tmp_path):
    clock = SimulatedClock()
    pool = ScriptedPool(clock, [(0, "join", ("a", "b", "c", "d")), (100, "notice", ("d",)), (103, "leave", ("d",))])
    frags = SimulatedFragments(clock)
    orch = _orchestrator(tmp_path, clock, pool, frags)
    futs = [orch.submit(TrainingJob(n, samples=60_000, min_nodes=1, max_nodes=2, global_batch=8, rate_guess=RATE))
            for n in ("x", "y")]
    real = time.monotonic()
    summary = orch.run(timeout_s=10_000)
    assert time.monotonic() - real < 60, "simulated time should cost little real time"
    assert all(f.done() and f.exception() is None for f in futs)
    assert {r.job: r.status for r in summary.jobs} == {"x": "done", "y": "done"}
    reclaims = [d for _, _, d in orch.db.events("reclaim")]
    assert [(d["by"], d["nodes"]) for d in reclaims][:1] == [("notice", ["d"])]
    hit = reclaims[0]["job"]
    stops = [d for _, _, d in orch.db.events("stop-request") if d["job"] == hit]
    assert stops and stops[0]["why"] == "reclaim notice"
    assert "d" in pool.released            # checkpointed: given back before it left
    # each job first ran on 2 nodes; the one hit went on with 1, and 60k samples at 100/s/node took > 300 s
    assert frags.launches[:2] == [("x", 2), ("y", 2)] or frags.launches[:2] == [("y", 2), ("x", 2)]
    assert (hit, 1) in frags.launches
    assert clock.monotonic() - 1_000.0 > 300
    orch.close()


def test_a_crash_loop_fails_the_job_after_max_failures_and_the_other_job_goes_on(tmp_path):
    clock = SimulatedClock()
    pool = ScriptedPool(clock, [(0, "join", ("a", "b"))])
    frags = SimulatedFragments(clock, crash=("bad",))
    orch = _orchestrator(tmp_path, clock, pool, frags, max_failures=3)
    bad = orch.submit(TrainingJob("bad", samples=1_000, max_nodes=1, global_batch=8, rate_guess=RATE))
    good = orch.submit(TrainingJob("good", samples=20_000, max_nodes=1, global_batch=8, rate_guess=RATE))
    orch.run(timeout_s=10_000)
    with pytest.raises(JobFailed, match=r"job bad: 3 fragments failed in a row without progress; last: .*ImportError"):
        bad.result(timeout=0)
    assert good.result(timeout=0) is None or good.exception() is None
    assert [j for j, _ in frags.launches].count("bad") == 3
    failed = [d for _, _, d in orch.db.events("fragment-failed")]
    assert len(failed) == 3 and not any(d["reclaimed"] for d in failed)
    assert orch.db.job("bad").status == "failed" and orch.db.job("good").status == "done"
    orch.close()


def test_a_run_cut_short_leaves_its_jobs_waiting_and_the_next_run_counts_on(tmp_path):
    """A run that ends before its jobs (here its time limit; Ctrl-C and SIGTERM take the same path) leaves no job
    'running' on nodes it no longer holds, and the next run on the same state directory goes on counting the
    node-seconds held (a restart began again from 0 while the training time added up: shares over 100 %)."""
    clock = SimulatedClock()
    job = TrainingJob("x", samples=200_000, min_nodes=1, max_nodes=2, global_batch=8, rate_guess=RATE)
    first = _orchestrator(tmp_path, clock, ScriptedPool(clock, [(0, "join", ("a", "b"))]), SimulatedFragments(clock))
    first.submit(job)
    cut = first.run(timeout_s=300)
    assert cut.ended == "timeout" and [(r.status, r.state) for r in cut.jobs] == [
        ("stopped", "stopped: time cap reached")]
    assert 0 < cut.jobs[0].e_used <= 1 and cut.e_used <= 1 and cut.train_share <= 1
    row = first.db.job("x")
    assert (row.status, row.size) == ("waiting", 0) and row.node_s >= 500
    held_before = row.node_s
    first.close()
    frags = SimulatedFragments(clock)
    frags.saved["x"] = row.samples_done
    second = _orchestrator(tmp_path, clock, ScriptedPool(clock, [(0, "join", ("a", "b"))]), frags)
    fut = second.submit(job)
    second.run(timeout_s=10_000)
    assert fut.exception(timeout=0) is None
    row = second.db.job("x")
    assert row.status == "done" and row.node_s > held_before
    assert row.train_node_s <= row.node_s
    second.close()


def test_a_loop_that_never_reports_fails_its_own_job_and_a_deaf_one_is_only_reclaimed(tmp_path):
    """A loop that never reaches ctx.should_stop() writes no progress report and ignores the stop request: it is
    killed when its node leaves. Having held its node NO_REPORT_S without one report, that is its own failure
    (three in a row: the job fails), not a reclaim to relaunch on every hole for ever. A loop that reports but
    does not stop in time is killed the same way, and that stays a reclaim. The run then hits its time cap and
    says so. What the silent loop started in a session of its own ends with each of its fragments."""
    from parsl_bft.execution.fragments import NO_REPORT_S
    clock = SimulatedClock()
    hole = NO_REPORT_S + 100
    script = [(0.0, "join", ("a", "b"))]
    for k in range(4):                      # each node idle for `hole` s, then a notice, then gone for 7 s
        t = k * (hole + 10)
        script += [(t + hole, "notice", ("a", "b")), (t + hole + 3, "leave", ("a", "b")),
                   (t + hole + 10, "join", ("a", "b"))]
    pool = ScriptedPool(clock, script)
    frags = SimulatedFragments(clock, deaf=("deaf",), silent=("mute",), pool=pool)
    orch = _orchestrator(tmp_path, clock, pool, frags, max_failures=3, poll_s=5.0)
    mute = orch.submit(TrainingJob("mute", samples=10**6, max_nodes=1, global_batch=8, rate_guess=RATE))
    deaf = orch.submit(TrainingJob("deaf", samples=10**6, max_nodes=1, global_batch=8, rate_guess=RATE))
    summary = orch.run(timeout_s=3.5 * (hole + 10))
    with pytest.raises(JobFailed, match=r"job mute: 3 fragments failed in a row .*without one progress report"):
        mute.result(timeout=0)
    failed = [d for _, _, d in orch.db.events("fragment-failed")]
    assert [d["reclaimed"] for d in failed if d["job"] == "mute"] == [False] * 3
    deaf_failed = [d["reclaimed"] for d in failed if d["job"] == "deaf"]
    assert len(deaf_failed) == 3 and all(deaf_failed) and not deaf.done()
    assert summary.ended == "timeout"
    assert {r.job: r.status for r in summary.jobs} == {"mute": "failed", "deaf": "stopped"}
    assert len(frags.helpers) == 3 and [h.wait(timeout=30) for h in frags.helpers] == [-signal.SIGKILL] * 3
    orch.close()


def test_a_dead_rendezvous_store_stops_the_run_with_the_reason(tmp_path):
    """The store's process killed: the run went on launching fragments that could never meet, at the same
    progress for over 10 minutes with no error. Now the next turn of the loop stops the run, saying why, and the
    fragment that was running is asked to checkpoint."""
    from parsl_bft.train.launcher import RendezvousLost, RendezvousStore
    clock = SimulatedClock()
    frags = SimulatedFragments(clock)
    orch = _orchestrator(tmp_path, clock, ScriptedPool(clock, [(0, "join", ("a", "b"))]), frags)
    orch._store = store = RendezvousStore()          # what _site_runners serves for real runners
    killed_at = []

    def kill_at_100(_):
        if not killed_at and frags.launches and clock.monotonic() - 1_000.0 > 100:
            os.kill(store._proc.pid, signal.SIGKILL)
            store._proc.wait()                        # gone: the next look at it sees so
            killed_at.append(clock.monotonic())
    clock.on_sleep.append(kill_at_100)
    orch.submit(TrainingJob("x", samples=10**9, max_nodes=2, global_batch=8, rate_guess=RATE))
    with pytest.raises(RendezvousLost, match=r"rendezvous store \(process \d+\) ended \(killed by SIGKILL\): no "
                                             r"fragment can start; the run stops"):
        orch.run(timeout_s=10_000)
    assert killed_at and clock.monotonic() - killed_at[0] < 120      # the next turn, not the time cap
    why = orch.db.events("stop")[-1][2]["why"]
    assert why.startswith("error: RendezvousLost(") and "shutdown" in {
        d["why"] for _, _, d in orch.db.events("stop-request")}
    orch.close()


def test_the_pool_is_told_which_of_its_nodes_the_plan_gives_a_job(tmp_path):
    """What a pilot pool needs to give back pilots the plan leaves unused: every loop turn the orchestrator sets
    ``in_use`` to the nodes its plan gives a job now (here one job of at most 2 nodes on 3 idle nodes)."""
    clock = SimulatedClock()
    pool = ScriptedPool(clock, [(0, "join", ("a", "b", "c"))])
    orch = _orchestrator(tmp_path, clock, pool, SimulatedFragments(clock))
    orch.submit(TrainingJob("x", samples=20_000, max_nodes=2, global_batch=8, rate_guess=RATE))
    seen = []
    orch.run(timeout_s=10_000, progress=lambda o: seen.append(set(pool.in_use)))
    assert seen[0] == set() and max(len(s) for s in seen) == 2 and all(s <= {"a", "b", "c"} for s in seen)
    orch.close()


def test_the_pool_learns_how_long_a_stop_takes_and_the_next_run_remembers(tmp_path):
    """Every stop the orchestrator asks for (here a rescale when nodes join) is timed from the request to the
    fragment's collection; the pool is told the slowest of the last ones (its walltime notice needs no more
    lead than that), and the state directory keeps them for the next run."""
    clock = SimulatedClock()
    pool = ScriptedPool(clock, [(0, "join", ("a",)), (100, "join", ("b", "c"))])
    orch = _orchestrator(tmp_path, clock, pool, SimulatedFragments(clock))
    orch.submit(TrainingJob("x", samples=120_000, min_nodes=1, max_nodes=3, global_batch=12, rate_guess=RATE))
    orch.run(timeout_s=10_000)
    assert [d["why"] for _, _, d in orch.db.events("stop-request")][:1] == ["rescale 1 -> 3"]
    # the simulated fragments see a STOP file at the next tick of the clock (poll_s = 1 s): collected 1-2 s later
    assert pool.stop_s is not None and 0 < pool.stop_s <= 3.0, pool.stop_s
    orch.close()
    again = _orchestrator(tmp_path, clock, ScriptedPool(clock, []), SimulatedFragments(clock))
    assert again.policy.stop_s == pool.stop_s
    again.close()
