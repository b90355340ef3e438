"""Every mistake in a job's code or arguments fails at submit, before any worker starts, in one line naming it:
a misspelled class, function, workload_args key or schedule (each once trained silently or failed in every rank
after the workers started, with retries and a traceback through the library)."""
import textwrap
import time

import pytest

from parsl_bft.execution.training_job import TrainingJob
from parsl_bft.jobs import JobSpecError
from parsl_bft.train.workloads import SyntheticImages, Workload, WorkloadError

MODEL = '''
from torch import nn
from torch.utils.data import TensorDataset
import torch
from parsl_bft.train.workloads import Workload


class DigitsRes(Workload):
    def __init__(self, width=64, **kw):        # the docs' pattern: its own arguments, the rest passed on
        super().__init__(**kw)
        self.width = width

    def dataset(self):
        raise AssertionError("the submit check reads no data")

    def build_model(self):
        return nn.Linear(4, self.width)


def train(ctx):
    pass
'''


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "digits_model.py"
    path.write_text(MODEL)
    return path


def _refused(job: TrainingJob, expect: str) -> str:
    """The job is refused at submit, within 5 s, in one line that contains ``expect``."""
    t = time.monotonic()
    with pytest.raises(JobSpecError) as e:
        job.check_submit(ranks_per_node=1)
    assert time.monotonic() - t < 5
    msg = str(e.value)
    assert "\n" not in msg and expect in msg, msg
    return msg


def test_a_misspelled_workload_class_fails_at_submit_naming_the_nearest(model):
    msg = _refused(TrainingJob("j", workload=f"{model}:DigitRes", global_batch=8),
                   "defines no 'DigitRes' (did you mean 'DigitsRes'?)")
    assert msg.startswith("job 'j': cannot load workload")


def test_a_misspelled_training_function_fails_at_submit_naming_the_nearest(model):
    _refused(TrainingJob("j", loop=f"{model}:trian", global_batch=8), "defines no 'trian' (did you mean 'train'?)")
    TrainingJob("j", loop=f"{model}:train", global_batch=8).check_submit(ranks_per_node=1)     # spelled right


@pytest.mark.parametrize("args, expect", [
    ({"widht": 16}, "DigitsRes takes no workload_args 'widht' (did you mean 'width'?); it takes: eval_every, lr, "
                    "schedule, seed, warmup, width"),
    ({"learning_rate": 1e-4}, "takes no workload_args 'learning_rate'"),
    ({"lr": "fast"}, "lr is a number >= 0, got 'fast'"),
])
def test_an_unknown_workload_args_key_is_refused_through_a_subclass_passthrough(model, args, expect):
    _refused(TrainingJob("j", workload=f"{model}:DigitsRes", global_batch=8, workload_args=args), expect)
    TrainingJob("k", workload=f"{model}:DigitsRes", global_batch=8,
                workload_args={"width": 16, "lr": 1e-4}).check_submit(ranks_per_node=1)


def test_a_built_in_workload_refuses_a_misspelled_key_too():
    _refused(TrainingJob("j", workload="images", workload_args={"widht": 16}), "(did you mean 'width'?)")
    with pytest.raises(WorkloadError, match="takes no workload_args 'widht'"):      # and in a rank, unchecked
        SyntheticImages(widht=16)


@pytest.mark.parametrize("args, expect", [
    ({"schedule": "cosin"}, "unknown schedule 'cosin'"),
    ({"schedule": "step:0.1@half"}, "schedule 'step:0.1@half': write step:GAMMA@M1,M2"),
    ({"schedule": "cosine", "warmup": 1.5}, "warmup is a fraction of the run in [0, 1)"),
])
def test_a_misspelled_schedule_fails_at_submit(args, expect):
    _refused(TrainingJob("j", workload="images", workload_args=args), expect)
    TrainingJob("k", workload="images", workload_args={"schedule": "step:0.1@30e,60e", "warmup": "2e"}) \
        .check_submit(ranks_per_node=1)       # epochs: the data set's length is not read at submit


def test_a_subclass_that_reads_kwargs_names_them_in_extra_args():
    """The documented escape for a subclass that keeps its arguments in self.kwargs: they are not typos."""
    class Loose(Workload):
        extra_args = ("depth",)
    assert Loose(depth=3).kwargs == {"depth": 3}
    with pytest.raises(WorkloadError, match=r"Loose takes no workload_args 'dpeth' \(did you mean 'depth'\?\)"):
        Loose(dpeth=3)


def test_a_file_that_fails_to_import_is_refused_with_where(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text(textwrap.dedent("""
        import torch
        x = undefined_name
        """))
    msg = _refused(TrainingJob("j", workload=f"{bad}:Model"), "NameError: name 'undefined_name' is not defined")
    assert f"{bad}:3:" in msg
    (tmp_path / "syntax.py").write_text("def train(ctx)\n    pass\n")
    _refused(TrainingJob("j", loop=f"{tmp_path / 'syntax.py'}:train"), "SyntaxError")


def test_a_factory_with_a_fixed_signature_names_the_argument(tmp_path):
    f = tmp_path / "fac.py"
    f.write_text("from parsl_bft.train.workloads import SyntheticImages\n"
                 "def make(seed=0, width=8):\n    return SyntheticImages(seed=seed, width=width)\n"
                 "def notone(seed=0):\n    return 5\n")
    _refused(TrainingJob("j", workload=f"{f}:make", workload_args={"widht": 3}), "unexpected keyword argument 'widht'")
    _refused(TrainingJob("j", workload=f"{f}:notone"), "built a int, not a Workload")


def test_the_cli_shows_a_submit_mistake_as_one_line(tmp_path, model, capsys):
    from parsl_bft.cli import main
    wf = tmp_path / "wf.py"
    wf.write_text("from parsl_bft.execution import TrainingJob\n"
                  f"TrainingJob('j', workload='{model}:DigitsRes', workload_args={{'widht': 3}}).check_submit(1)\n")
    assert main(["run", str(wf)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'width'?" in err and "Traceback" not in err, err


def test_a_user_error_in_a_session_is_not_chained_to_parsl_s_no_dataflow_kernel_error(tmp_path):
    """TrainingJob(max_node=2) in a session showed NoDataFlowKernelError, 'During handling of the above
    exception...', then the TypeError: the session's block ran inside that handler."""
    from parsl_bft.execution.session import _dataflow
    with pytest.raises(TypeError) as e, _dataflow([], run_dir=str(tmp_path / "runinfo"), initialize_logging=False):
        TrainingJob("j", max_node=2)                # type: ignore[call-arg]
    assert e.value.__context__ is None and e.value.__cause__ is None


def test_a_rank_that_cannot_load_the_job_s_code_fails_the_job_without_retries(tmp_path):
    """A file edited after submit (or a job read back by a restart): trying again cannot help, so the job fails
    at its first such fragment, not after max_failures of them."""
    from concurrent.futures import Future

    from simulated import RATE, ScriptedPool, SimulatedFragments, _orchestrator

    from parsl_bft.execution.clock import SimulatedClock
    from parsl_bft.execution.errors import JobFailed
    from parsl_bft.execution.htex import FragmentHandle
    from parsl_bft.train.config import FragmentFailed
    from parsl_bft.train.protocol import JobDir

    class CodeGone(SimulatedFragments):
        def launch(self, cfg, nodes):
            self.launches.append((cfg.job, len(nodes)))
            JobDir(cfg.checkpoint_dir).record_error(cfg.fragment_id, 0, WorkloadError("cannot load workload"))
            fut: Future = Future()
            fut.set_exception(FragmentFailed("rank 0 exited with 1"))
            return FragmentHandle([fut])

    clock = SimulatedClock()
    frags = CodeGone(clock)
    orch = _orchestrator(tmp_path, clock, ScriptedPool(clock, [(0, "join", ("a",))]), frags, max_failures=3)
    fut = orch.submit(TrainingJob("gone", samples=1_000, max_nodes=1, global_batch=8, rate_guess=RATE))
    orch.run(timeout_s=10_000)
    with pytest.raises(JobFailed, match=r"job gone: 1 fragment failed in a row without progress; last: .*WorkloadErr"):
        fut.result(timeout=0)
    assert frags.launches == [("gone", 1)]
    orch.close()
