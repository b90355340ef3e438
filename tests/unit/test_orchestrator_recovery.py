"""The orchestrator recovering from what goes wrong under it, with fragments run inline (tests/harness.py): a
damaged newest checkpoint, a fragment still waiting for a worker on nodes reclaimed, a gang whose nodes all left,
a crash loop against failures that saved progress."""
import signal
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

from parsl_bft.train.checkpoint import load_checkpoint

from harness import IMG_JOB, InlineRunner, damage_checkpoint, inline_orchestrator


def test_orchestrator_given_a_damaged_newest_checkpoint_finishes_from_the_previous_one(tmp_path, monkeypatch):
    from parsl_bft.execution.orchestrator import TrainingJob
    from parsl_bft.train.fragment import FragmentConfig, train_rank
    state = tmp_path / "state"
    jobdir = state / "jobs" / "img"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    base = dict(job="img", workload="images", checkpoint_dir=str(jobdir), global_batch=32, fsync=False,
                deterministic=False, workload_args={"n": 256})
    try:
        train_rank(FragmentConfig(steps=2, **base))
        train_rank(FragmentConfig(steps=1, **base))
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    damage_checkpoint(jobdir / "ckpt-000000003.h5")
    orch = inline_orchestrator(state, monkeypatch)
    fut = orch.submit(TrainingJob("img", **IMG_JOB))
    orch.run(timeout_s=120)
    final = Path(fut.result(timeout=0))
    assert final.exists() and load_checkpoint(final).step == 8
    done = [d for _, _, d in orch.db.events("fragment-done")]
    assert done[0]["start_step"] == 2 and done[-1]["end_step"] == 8       # resumed from the previous good one
    assert not orch.db.events("fragment-failed")
    assert (jobdir / "damaged").is_dir() and not (jobdir / "ckpt-000000003.h5").exists()
    # the database stores the path relative to the state directory
    assert orch.db.job("img").checkpoint == "jobs/img/ckpt-000000008.h5"
    orch.close()


def node_a_then_b(tmp_path, monkeypatch, runner):
    """An orchestrator whose fragments go through ``runner``, on node a (reclaimed at 30 s, notice 1 s ahead: time
    for a loaded machine to launch there first; at 5 s, a first launch that took 5.4 s under load went to b) and
    then node b (from 31 s on), run on a 64-sample img job: (orchestrator, the job's future)."""
    from parsl_bft.execution import orchestrator as orch_mod
    from parsl_bft.execution.orchestrator import TrainingJob
    from parsl_bft.execution.pool import EmulatedPool
    from parsl_bft.idle.intervals import IdleIntervals
    from parsl_bft.planner import Planner
    monkeypatch.setattr(orch_mod, "SiteRunner", runner)
    idle = IdleIntervals.build(["a", "b"], [0, 1], [0.0, 31.0], [30.0, 10_000.0], 0.0, 10_000.0)
    orch = orch_mod.Orchestrator(tmp_path / "s", EmulatedPool(idle, speedup=1.0, notice_s=1.0),
                                 Planner(method="dp", objective="throughput", t_fwd=20.0), warm_up=False,
                                 settle_s=0.0, poll_s=0.01)
    fut = orch.submit(TrainingJob("img", **{**IMG_JOB, "samples": 64}))
    run_within(orch, 600, "training img on node b once a was reclaimed")
    return orch, fut


def run_within(orch, budget_s, what):
    """``orch.run()`` with a budget: on a loaded machine a wrong "timeout" assertion said nothing about why."""
    orch.run(timeout_s=budget_s)
    if orch.db.events("stop")[-1][2]["why"] == "timeout":
        pytest.fail(f"ran out of time ({budget_s} s) at: {what}")


class StuckFirstRunner(InlineRunner):
    """The first fragment is a gang whose two node shares wait for a worker that never comes (their lane's
    pilots were reclaimed); later ones run inline."""

    def __init__(self, name, site, store):
        super().__init__(name, site, store)
        self.store, self.stuck = store, None

    def launch(self, cfg, nodes):
        from parsl_bft.execution.htex import FragmentHandle
        if self.stuck is None:
            self.stuck = FragmentHandle([Future(), Future()], self.store, cfg.fragment_id)
            return self.stuck
        return super().launch(cfg, nodes)


@pytest.mark.slow
def test_a_fragment_still_waiting_for_a_worker_when_its_nodes_are_reclaimed_is_given_up(tmp_path, monkeypatch):
    """It used to wait in its lane for a new pilot of that group (a minute or more of no training). Given up at
    the notice, it never starts even if a worker picks it up later; the job trains on elsewhere and finishes."""
    from parsl_bft.train.fragment import FragmentConfig
    from parsl_bft.train.launcher import run_gang_task
    orch, fut = node_a_then_b(tmp_path, monkeypatch, StuckFirstRunner)
    assert orch.db.events("stop")[-1][2]["why"] == "done"
    assert load_checkpoint(Path(fut.result(timeout=0))).samples_done == 64
    stuck = orch._runners[""].stuck
    (launch, *_), (gave_up,) = orch.db.events("launch"), orch.db.events("abandon")
    assert launch[2]["nodes"] == ["a"] and gave_up[2] == {"job": "img", "fragment": stuck.fragment, "shares": 2}
    (failed,) = [d for _, _, d in orch.db.events("fragment-failed")]
    assert failed["reclaimed"] and "never started" in failed["error"] and orch.failures.get("img", 0) == 0
    # a worker that picks a given-up share up later returns at once: no rank starts, nothing is written
    before = sorted(p.name for p in (tmp_path / "s" / "jobs" / "img").iterdir())
    cfg = FragmentConfig(job="img", workload="images", checkpoint_dir=str(tmp_path / "s" / "jobs" / "img"),
                         global_batch=32, world_size=2, fragment_id=stuck.fragment, timeout_s=5, steps=1)
    assert run_gang_task(cfg, 1, orch._store.address("127.0.0.1")) is None
    assert sorted(p.name for p in (tmp_path / "s" / "jobs" / "img").iterdir()) == before
    orch.close()


class HungGangRunner(InlineRunner):
    """The first fragment is a one-node gang whose share started on its node and then hangs: its pilot is gone,
    and the executor has not noticed (HTEX notices a heartbeat threshold later). Later ones run inline."""

    def __init__(self, name, site, store):
        super().__init__(name, site, store)
        self.gang, self.store, self.hung = True, store, None

    def launch(self, cfg, nodes):
        from parsl_bft.execution.htex import FragmentHandle
        if self.hung is None:
            self.store.set(f"{cfg.fragment_id}/share/0", "started")
            self.store.set(f"{cfg.fragment_id}/node/0", nodes[0])
            self.hung = FragmentHandle([Future()], self.store, cfg.fragment_id)
            return self.hung
        return super().launch(cfg, nodes)

    def placed(self, fragment, nodes):
        key = f"{fragment}/node/0"
        return {0: self.store.get(key).decode()} if self.store.check([key]) else {}


@pytest.mark.slow
def test_a_gang_whose_nodes_all_left_is_collected_without_waiting_for_the_executor(tmp_path, monkeypatch):
    """Once every node a gang's started shares run on has left, it is collected at once (its ranks are dead, or
    fenced off: only the job's newer fragment may save), and the job goes on elsewhere."""
    from parsl_bft.train.protocol import JobDir
    orch, fut = node_a_then_b(tmp_path, monkeypatch, HungGangRunner)
    assert orch.db.events("stop")[-1][2]["why"] == "done"
    assert load_checkpoint(Path(fut.result(timeout=0))).samples_done == 64
    hung = orch._runners[""].hung
    assert not hung.done()                              # the executor never answered for it
    (failed,) = [d for _, _, d in orch.db.events("fragment-failed")]
    assert failed["fragment"] == hung.fragment and failed["reclaimed"] and "every node it ran on has left (a)" in \
        failed["error"] and orch.failures.get("img", 0) == 0
    launches = [d for _, _, d in orch.db.events("launch")]
    assert launches[-1]["nodes"] == ["b"] and JobDir(tmp_path / "s" / "jobs" / "img").current_fragment() == \
        launches[-1]["fragment"]
    orch.close()


class FailingRunner(InlineRunner):
    """Fragments whose rank is SIGKILLed from outside: the first ``killed`` ones after saving a step of progress
    (``progress``) or before training at all; later ones run inline."""

    killed, progress = 0, False

    def launch(self, cfg, nodes):
        from parsl_bft.execution.htex import FragmentHandle
        from parsl_bft.train.fragment import FragmentFailed
        if FailingRunner.killed <= 0:
            return super().launch(cfg, nodes)
        FailingRunner.killed -= 1
        if FailingRunner.progress:
            super().launch(replace(cfg, steps=1, total_samples=None), nodes)      # saves one step more
        fut: Future = Future()
        fut.set_exception(FragmentFailed(f"fragment of {cfg.job}: rank 0 exited with -9"))
        return FragmentHandle([fut])


@pytest.mark.parametrize("progress", [False, True], ids=["a crash loop", "killed after saving progress"])
def test_a_job_gives_up_on_a_crash_loop_not_on_failures_that_saved_progress(tmp_path, monkeypatch, progress):
    """max_failures (3) fragments failing in a row without a newer checkpoint is a crash loop: the job fails,
    its future says why. A fragment that saved progress before it died (a rank killed from outside, 3 times
    here) starts a new row: the job goes on and finishes."""
    from parsl_bft.execution import orchestrator as orch_mod
    from parsl_bft.execution.orchestrator import JobFailed, TrainingJob
    monkeypatch.setattr(FailingRunner, "killed", 3 if progress else 100)
    monkeypatch.setattr(FailingRunner, "progress", progress)
    orch = inline_orchestrator(tmp_path / "s", monkeypatch)
    monkeypatch.setattr(orch_mod, "SiteRunner", FailingRunner)
    fut = orch.submit(TrainingJob("img", **{**IMG_JOB, "samples": 32 * 6}))
    run_within(orch, 600, "the job's fragments failing, then training (or giving up)")
    failed = [d for _, _, d in orch.db.events("fragment-failed")]
    if progress:
        assert len(failed) == 3 and all(d["saved_step"] == d["resume_step"] + 1 for d in failed)
        assert load_checkpoint(Path(fut.result(timeout=0))).step == 6
    else:
        assert len(failed) == 3 and orch.db.jobs()["img"].status == "failed"
        with pytest.raises(JobFailed, match="job img: 3 fragments failed in a row without progress; last: "
                                            "fragment of img: rank 0 exited with -9"):
            fut.result(timeout=0)
    orch.close()
