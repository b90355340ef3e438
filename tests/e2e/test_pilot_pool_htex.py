"""PilotPool on a real HighThroughputExecutor: a pilot that gets its notice has its block held, so the real
interchange sends its worker pool no new task (what ``hold_block`` does through Parsl's own scale-in path)."""
import contextlib
import time

import parsl
import pytest
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.jobs.states import JobState
from parsl.providers import LocalProvider

from parsl_bft.execution.config import ensure_venv_on_path
from parsl_bft.execution.pool import PilotPool
from parsl_bft.execution.protocols import NoticeReason, PoolEventKind

from harness import wait_for

pytestmark = pytest.mark.slow          # real Parsl, ranks or a whole benchmark: not in the inner loop


class LocalPilots(LocalProvider):
    """A LocalProvider whose blocks the pool takes for one-node pilots on this host: running blocks run on
    'localhost', there are no holes to soak and no facility job claims a node; the test marks a pilot as
    signalled by its scheduler (``marks``)."""

    notice_s, can_target, multi_node, pilot_nodes, refused = 20, False, False, 1, None

    def __init__(self):
        super().__init__(init_blocks=1, min_blocks=0, max_blocks=1)
        self.marks: set[str] = set()
        self.sizes: dict[str, int] = {}
        self.targets: dict[str, tuple[str, ...]] = {}

    def topology(self):
        return None

    def pilots(self, shape):                 # one-node pilots only (PilotProvider.pilots)
        return contextlib.nullcontext()

    def claimed(self, within_s, now=None):
        return set()

    def snapshot(self, max_age_s=None):
        return None

    def where(self, job_ids):
        return {j: (("localhost",), None) for j, s in zip(job_ids, self.status(job_ids))
                if s.state == JobState.RUNNING}

    def noticed(self, job_id):
        return job_id in self.marks

    def current_holes(self):
        return []

    def job_slots(self):
        return None


@pytest.mark.timeout(180)
def test_a_noticed_pilots_block_is_held_on_the_real_executor(tmp_path):
    ensure_venv_on_path()
    provider = LocalPilots()
    htex = HighThroughputExecutor(label="pilots", address="127.0.0.1", max_workers_per_node=1, cores_per_worker=0.01,
                                  cpu_affinity="none", heartbeat_period=2, heartbeat_threshold=10, provider=provider)
    with parsl.load(Config(executors=[htex], run_dir=str(tmp_path / "runinfo"), retries=0, strategy="none",
                           initialize_logging=False)):
        app = parsl.python_app(abs, executors=["pilots"])   # importable by the worker
        wait_for(lambda: [m for m in htex.connected_managers() if str(m["block_id"]) == "0"], 60,
                 what="block 0's worker pool connected")
        pool = PilotPool(htex, max_nodes=1, probe_s=3600.0, poll_s=0.0)      # the real hold: hold_block
        pool.start()
        assert [(e.kind, e.nodes) for e in pool.poll()] == [(PoolEventKind.JOIN, ("localhost",))]
        assert app(-1).result(timeout=60) == 1                    # the joined pilot's worker pool serves
        (job,) = htex.blocks_to_job_id.values()
        provider.marks.add(job)                                   # the scheduler signals the pilot
        (ev,) = pool.poll()
        assert (ev.kind, ev.nodes, ev.why) == ("notice", ("localhost",), NoticeReason.SIGNAL)
        (manager,) = htex.connected_managers()
        assert str(manager["block_id"]) == "0" and manager["active"] is False   # held by the interchange
        late = app(-2)
        time.sleep(3)
        assert not late.done() and htex.connected_managers()[0]["tasks"] == 0   # nothing was sent to it
        assert pool.poll() == []                                  # noticed once; still running, not left
        pool.stop()                                               # the pilot is given back
        wait_for(lambda: provider.status([job])[0].terminal, 30, what="the given-back pilot ended")
