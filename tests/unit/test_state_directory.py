"""The state directory: one orchestrator at a time, private modes, job names that cannot escape it, jobs refused
at submit before anything is recorded, a tampered row refused on restart, a moved directory still found."""
import os
import stat
from pathlib import Path

import pytest

from parsl_bft.train.checkpoint import load_checkpoint

from harness import IMG_JOB, inline_orchestrator


def test_a_second_orchestrator_on_a_state_directory_is_refused(tmp_path, monkeypatch):
    from parsl_bft.execution.orchestrator import StateLocked
    first = inline_orchestrator(tmp_path / "s", monkeypatch)
    with pytest.raises(StateLocked, match=r"in use by another orchestrator .*pid"):
        inline_orchestrator(tmp_path / "s", monkeypatch)
    first.close()
    inline_orchestrator(tmp_path / "s", monkeypatch).close()       # free again once the first is gone
    assert stat.S_IMODE(os.stat(tmp_path / "s").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "s" / "state.sqlite").st_mode) == 0o600


@pytest.mark.parametrize("name", ["../../x", "/etc", "..", ".", "./a", "x/../a", "a/b", "a\nb", "a\x00", "", " a",
                                  "-rf", "a" * 200, "ä"])
def test_job_names_that_would_escape_or_alias_a_directory_are_refused(name):
    from parsl_bft.execution.orchestrator import TrainingJob
    with pytest.raises(ValueError, match="job name"):
        TrainingJob(name)


def test_global_batch_below_max_nodes_is_refused_at_submit(tmp_path, monkeypatch):
    from parsl_bft.execution.orchestrator import TrainingJob
    orch = inline_orchestrator(tmp_path / "s", monkeypatch)
    with pytest.raises(ValueError, match="global_batch 2 < max_nodes 4"):
        orch.submit(TrainingJob("small", global_batch=2, max_nodes=4))
    assert not orch.db.jobs()
    orch.close()


@pytest.mark.parametrize("kw, named", [
    ({"rate_guess": 0}, "rate_guess must be a number > 0, got 0"),
    ({"rate_guess": float("nan")}, "rate_guess must be a number > 0, got nan"),
    ({"global_batch": 0.5}, "global_batch must be an integer > 0, got 0.5"),
    ({"samples": 0}, "samples: must be > 0"),
    ({"t_down": -1}, "t_down: must be >= 0"),
    ({"max_nodes": 0}, "max_nodes: min_nodes 1 > max_nodes 0"),
])
def test_a_bad_number_in_a_training_job_is_refused_at_submit_naming_its_field(tmp_path, monkeypatch, kw, named):
    """rate_guess=0 was refused deep in the planner as a bad scaling curve; samples=0 without naming the field."""
    from parsl_bft.execution.orchestrator import TrainingJob
    orch = inline_orchestrator(tmp_path / "s", monkeypatch)
    with pytest.raises(ValueError) as err:
        orch.submit(TrainingJob("j", **kw))
    assert str(err.value).startswith(f"job 'j': {named}")
    assert not orch.db.jobs()
    orch.close()


def test_a_tampered_job_row_is_refused_on_restart(tmp_path, monkeypatch):
    from parsl_bft.execution.jobstore import JobStore, StateError
    db = JobStore(tmp_path / "s" / "state.sqlite")
    db.add("../../x", {"name": "../../x"})
    db.close()
    with pytest.raises(StateError, match=r"damaged .*job name"):
        inline_orchestrator(tmp_path / "s", monkeypatch)


def test_a_moved_state_directory_still_finds_its_checkpoints(tmp_path, monkeypatch):
    from parsl_bft.execution.orchestrator import TrainingJob
    orch = inline_orchestrator(tmp_path / "a", monkeypatch)
    job = TrainingJob("img", **{**IMG_JOB, "samples": 64})
    fut = orch.submit(job)
    orch.run(timeout_s=120)
    assert Path(fut.result(timeout=0)).parent == tmp_path / "a" / "jobs" / "img"
    orch.close()
    (tmp_path / "a").rename(tmp_path / "b")
    again = inline_orchestrator(tmp_path / "b", monkeypatch)
    moved = Path(again.submit(job).result(timeout=0))
    assert moved.parent == tmp_path / "b" / "jobs" / "img" and load_checkpoint(moved).samples_done == 64
    again.close()
