"""A stop on a notice without a blocking save: the newest periodic checkpoint is handed over when the steps since it
took less time than its write (saver.hand_over); the result says where the job stands, and the next fragment
resumes exactly there."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from parsl_bft.train import saver as saver_mod
from parsl_bft.train.checkpoint import CheckpointStore, TrainingState, load_checkpoint
from parsl_bft.train.config import FragmentConfig, StopReason
from parsl_bft.train.protocol import JobDir


def state(step: int) -> TrainingState:
    return TrainingState(model={"w": torch.full((4,), float(step))}, step=step, samples_done=32 * step)


def test_the_final_save_hands_over_the_periodic_checkpoint_only_on_a_notice_and_when_cheaper(tmp_path):
    """The rule compares the training since the periodic checkpoint's state was copied with that checkpoint's
    write: a write that took longer (here: as long as can be) hands it over on a notice; a write that took no
    time, or a stop that is no notice (the job's end), writes the state."""
    d = tmp_path / "job"
    cfg = FragmentConfig(job="j", workload="images", checkpoint_dir=str(d), fsync=False, steps=1)
    s = saver_mod.Saver(cfg, CheckpointStore(d), JobDir(d))
    assert s.periodic(state(5))
    assert s.background.wait() is not None and s.written == (5, 160) and s.write_s > 0
    s.write_s = float("inf")
    assert s.save(state(7), notice=False).name == "ckpt-000000007.h5"        # not a notice: written
    assert s.handed_over is None
    assert s.periodic(state(9))
    s.background.wait()
    s.write_s = 0.0
    assert s.save(state(11), notice=True).name == "ckpt-000000011.h5"        # cheaper to write than to redo
    assert s.handed_over is None
    assert s.periodic(state(13))
    s.background.wait()
    s.write_s = float("inf")
    assert s.save(state(15), notice=True).name == "ckpt-000000013.h5"        # handed over
    assert s.handed_over == (13, 416) and not (d / "ckpt-000000015.h5").exists()
    assert saver_mod.hand_over(0.5, 1.0) and not saver_mod.hand_over(1.0, 1.0)


STOPPER = '''
from parsl_bft.train.protocol import JobDir
from parsl_bft.train.workloads import SyntheticImages


class StopsAtStep3(SyntheticImages):
    """Asks its own fragment to stop (the orchestrator's STOP file) during its third step."""
    calls = 0

    def loss(self, model, batch):
        StopsAtStep3.calls += 1
        if StopsAtStep3.calls == 3:
            JobDir({jobdir!r}).request_stop(hand_over={hand_over})
        return super().loss(model, batch)
'''


@pytest.mark.parametrize("hand_over", [True, False])
def test_a_fragment_stopped_by_a_notice_reports_the_checkpoint_it_handed_over(tmp_path, monkeypatch, hand_over):
    """A fragment saving every step, told to stop during its third: by a request that lets it hand over (a
    resize, a reclaim) it writes no final checkpoint and reports the newest periodic one (its step and samples,
    the samples it trained apart); the next fragment resumes from exactly that step. By one that does not (a
    shutdown) the final state is written, as before."""
    from parsl_bft.train.fragment import train_rank
    d = tmp_path / "job"
    mod = tmp_path / "stopper.py"
    mod.write_text(STOPPER.format(jobdir=str(d), hand_over=hand_over))
    monkeypatch.setattr(saver_mod, "hand_over", lambda since_s, save_s: True)     # the decision is tested above
    base = dict(job="img", checkpoint_dir=str(d), global_batch=32, fsync=False, deterministic=False,
                workload_args={"n": 256}, checkpoint_every_s=1e-9)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        res = train_rank(FragmentConfig(workload=f"{mod}:StopsAtStep3", steps=50, **base))
        assert res.stopped_by is StopReason.SIGNAL and res.samples == 3 * 32        # three steps trained
        newest = CheckpointStore(d).paths()[0]
        assert Path(res.checkpoint) == newest
        kept = load_checkpoint(newest, arrays=False)
        assert (res.end_step, res.samples_done) == (kept.step, kept.samples_done)
        if hand_over:                        # a periodic save after step 1 or 2 (one still writing skips the next)
            assert 1 <= kept.step < 3 and not (d / "ckpt-000000003.h5").exists()
        else:
            assert kept.step == 3
        assert JobDir(d).progress().saved_step == kept.step and JobDir(d).stop_hands_over() == hand_over
        JobDir(d).clear_stop()
        nxt = train_rank(FragmentConfig(workload="images", steps=1, **base))
        assert nxt.start_step == kept.step and nxt.end_step == kept.step + 1
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def test_the_orchestrator_lets_a_resize_or_a_reclaim_hand_over_but_not_a_shutdown(tmp_path):
    """At shutdown the checkpoint written on the way out is the newest state (what a restart resumes from), so
    only a resize's or a reclaim's stop request lets a fragment hand over its periodic checkpoint."""
    from types import SimpleNamespace

    from parsl_bft.execution.fragments import Fragments
    from parsl_bft.execution.jobstore import JobStore
    fragments = Fragments(JobStore(tmp_path / "state.sqlite"), lambda name: tmp_path / name)
    for name, why in (("a", "reclaim notice"), ("b", "rescale 2 -> 1"), ("c", "shutdown")):
        (tmp_path / name).mkdir()
        fragments.running[name] = SimpleNamespace(stop_requested=False)
        fragments.request_stop(name, why)
        assert JobDir(tmp_path / name).stop_file.exists()
        assert JobDir(tmp_path / name).stop_hands_over() == (why != "shutdown"), why


USER_LOOP = '''
import torch
from parsl_bft.train.protocol import JobDir


def train(ctx):
    """A scientist's loop: saves at every step (a periodic save while it trains, the final one once told to
    stop); asks its own fragment to stop, as a resize would, during its third step."""
    w = ctx.restored["w"] if ctx.restored else torch.zeros(4)
    while True:
        w = w + 1
        if ctx.step == 2:
            JobDir({jobdir!r}).request_stop(hand_over=True)
        ctx.report(loss=float(w[0]))
        stop = ctx.should_stop()
        ctx.save({{"w": w}})
        if stop:
            return
'''


def test_a_users_own_loop_hands_over_its_periodic_checkpoint_too(tmp_path, monkeypatch):
    """ctx.save after a resize's stop request hands over the newest periodic save (when cheaper): the result
    and the next fragment's restored state are that save's."""
    from parsl_bft.train.fragment import train_rank
    d = tmp_path / "job"
    (tmp_path / "user.py").write_text(USER_LOOP.format(jobdir=str(d)))
    monkeypatch.setattr(saver_mod, "hand_over", lambda since_s, save_s: True)
    base = dict(job="mine", workload="unused", loop=f"{tmp_path / 'user.py'}:train", checkpoint_dir=str(d),
                global_batch=1, fsync=False, deterministic=False, steps=50)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        res = train_rank(FragmentConfig(**base))
        kept = load_checkpoint(res.checkpoint)
        assert res.stopped_by is StopReason.SIGNAL and res.samples == 3 and kept.step == res.end_step < 3
        assert torch.equal(kept.model["w"], torch.full((4,), float(kept.step)))     # that step's state
        assert not (d / "ckpt-000000003.h5").exists()
        JobDir(d).clear_stop()
        nxt = train_rank(FragmentConfig(**{**base, "steps": 1}))
        assert nxt.start_step == res.end_step
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
