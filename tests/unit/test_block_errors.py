"""The pilot block error policy on a real HighThroughputExecutor (the handler Parsl's job status poller calls)."""
import pytest
from parsl.executors import HighThroughputExecutor
from parsl.jobs.error_handlers import simple_error_handler
from parsl.jobs.states import JobState, JobStatus
from parsl.providers import LocalProvider

from parsl_bft.execution.block_errors import PilotsFailing, pilot_block_error_handler


def htex(handler):
    return HighThroughputExecutor(label="pilots", provider=LocalProvider(init_blocks=0, min_blocks=0),
                                  block_error_handler=handler)


def test_pilots_that_ran_and_ended_are_normal_where_parsls_default_gives_up():
    ran = {"0": JobStatus(JobState.RUNNING), "1": JobStatus(JobState.RUNNING)}
    ended = {"0": JobStatus(JobState.MISSING, "not known to the scheduler"), "1": JobStatus(JobState.TIMEOUT),
             "2": JobStatus(JobState.SCALED_IN, "withdrawn: did not start within the hole")}
    default = htex(True)                       # Parsl's default: simple_error_handler
    assert default.block_error_handler is simple_error_handler
    default.handle_errors(ran)
    default.handle_errors({"0": ended["0"], "1": JobStatus(JobState.MISSING)})
    assert default.bad_state_is_set           # every task would now fail: what the pilot policy prevents

    ours = htex(pilot_block_error_handler)
    ours.handle_errors(ran)
    ours.handle_errors(ended)
    ours.handle_errors({**ended, "3": JobStatus(JobState.MISSING)})
    assert not ours.bad_state_is_set


def test_pilots_failing_at_start_repeatedly_put_the_executor_in_a_bad_state_naming_the_cause():
    ex = htex(pilot_block_error_handler)
    ex.handle_errors({"0": JobStatus(JobState.RUNNING)})
    st = {"0": JobStatus(JobState.TIMEOUT)}
    for b in ("1", "2"):
        st[b] = JobStatus(JobState.FAILED, "sbatch: invalid account")
        ex.handle_errors(st)
    assert not ex.bad_state_is_set             # two in a row: could be bad luck
    st["3"] = JobStatus(JobState.RUNNING)      # one that runs resets the count
    ex.handle_errors(st)
    st["3"] = JobStatus(JobState.TIMEOUT)
    for b in ("4", "5", "6"):
        st[b] = JobStatus(JobState.FAILED, "sbatch: invalid account")
        ex.handle_errors(st)
    assert ex.bad_state_is_set
    err = ex.executor_exception
    assert isinstance(err, PilotsFailing) and "3 pilots in a row" in str(err) and "invalid account" in str(err)
    with pytest.raises(PilotsFailing):
        raise err
