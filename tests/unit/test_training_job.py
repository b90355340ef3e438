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


def test_a_job_with_a_tuple_argument_is_the_same_job_after_a_restart(tmp_path):
    """The stored spec went through JSON: the tuple came back a list, and the job was refused as 'another spec'."""
    import json
    from dataclasses import asdict

    from parsl_bft.execution.training_job import check_same_spec
    job = TrainingJob("j", workload_args={"dims": (8, 16)})
    stored = TrainingJob(**json.loads(json.dumps(asdict(job))))
    check_same_spec(stored, job, tmp_path)
    with pytest.raises(ValueError, match=r"another spec \(samples 50000 -> 60000\)"):
        check_same_spec(stored, TrainingJob("j", workload_args={"dims": (8, 16)}, samples=60_000), tmp_path)


def test_a_state_directory_must_be_private(tmp_path):
    """On a shared login node another user could prepare a state directory: writable by others, a link, or
    another's; each is refused naming the fix, and a lock file that is a link is never followed."""
    import os

    from parsl_bft.execution.errors import StateError
    from parsl_bft.execution.statedir import lock_state_dir
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(StateError, match=r"writable by others \(mode 777\): chmod 700"):
        lock_state_dir(open_dir)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(StateError, match="is a symbolic link"):
        lock_state_dir(tmp_path / "link")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (mine / "orchestrator.lock").symlink_to(victim)
    with pytest.raises(StateError, match=r"orchestrator\.lock is a symbolic link"):
        lock_state_dir(mine)
    assert victim.read_text() == "precious"
    (mine / "orchestrator.lock").unlink()
    lock_state_dir(mine).close()                       # a private directory of one's own: fine
    if os.getuid() == 0:                               # only root can give a directory away (CI runs as root)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(StateError, match="belongs to another user"):
            lock_state_dir(theirs)


def test_precision_compile_and_memory_format_reach_the_fragment_and_are_checked(tmp_path):
    """bf16/fp16, torch.compile and channels-last are the built-in loop's: named values reach its FragmentConfig;
    a typo, or asking them of your own loop (which picks its own), is refused at submit."""
    from parsl_bft.execution.fragments import fragment_config
    from parsl_bft.train.config import Precision
    from parsl_bft.train.protocol import JobDir

    def config(job):
        job.check_workload()
        return fragment_config(job, JobDir(tmp_path), fragment="j-1", world_size=1, ranks_per_node=1,
                               generation="g", interval_s=60.0, freeze_layers=0)
    c = config(TrainingJob("j", precision="bf16", compile=True, channels_last=True))
    assert (c.precision, c.compile, c.channels_last) == (Precision.BF16, "inductor", True)
    c = config(TrainingJob("j", compile="aot_eager", micro_batch=8))
    assert (c.precision, c.compile, c.channels_last, c.micro_batch) == (Precision.FP32, "aot_eager", False, 8)
    with pytest.raises(ValueError, match="micro_batch must be an integer >= 1"):
        TrainingJob("j", micro_batch=0).check_workload()
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16, got 'float16'"):
        TrainingJob("j", precision="float16").check_workload()
    with pytest.raises(ValueError, match=r"compile is True, False or a torch\.compile backend.s name"):
        TrainingJob("j", compile="").check_workload()
    script = tmp_path / "loop.py"
    script.write_text("def train(ctx):\n    pass\n")
    with pytest.raises(ValueError, match="precision, compile set the built-in loop's; your own loop chooses"):
        TrainingJob("k", loop=f"{script}:train", precision="bf16", compile=True).check_workload()


def test_a_job_name_with_a_trailing_newline_is_refused():
    """'$' let 'a\\n' through, and the job's directory was named 'a\\n'; the check lives in parsl_bft.jobs now
    (no torch there: the laptop's remote side uses it) and is still importable from here."""
    from parsl_bft.execution.training_job import check_job_name
    from parsl_bft.jobs import check_job_name as in_jobs
    assert check_job_name is in_jobs
    with pytest.raises(ValueError, match="job name 'a\\\\n': use 1-128 letters"):
        TrainingJob("a\n")


def test_workload_args_nested_too_deeply_to_store_are_refused_by_name():
    """It was a RecursionError traceback at submit."""
    from parsl_bft.execution.training_job import check_json_args
    x: list = []
    for _ in range(5000):
        x = [x]
    with pytest.raises(ValueError, match=r"workload_args\['x'\] is nested too deeply to store"):
        check_json_args(TrainingJob("a", workload_args={"x": x}))
