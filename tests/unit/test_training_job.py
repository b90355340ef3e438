"""A TrainingJob is checked when it is declared and submitted: what cannot work is refused at once, naming why."""
import pytest

from parsl_bft.execution.training_job import TrainingJob


def test_your_own_loop_cannot_be_frozen(tmp_path):
    """The planner freezes the blocks of a Workload its own loop runs; a user's loop ignores the level, so
    freeze=auto with loop= would measure and plan for a model that is not the one training."""
    script = tmp_path / "loop.py"
    script.write_text("def train(ctx):\n    pass\n")
    job = TrainingJob("j", loop=f"{script}:train", freeze="auto", accuracy_budget=0.01)
    with pytest.raises(ValueError, match="your own loop is never frozen"):
        job.check_workload()
    TrainingJob("k", loop=f"{script}:train").check_workload()          # without freezing: fine
