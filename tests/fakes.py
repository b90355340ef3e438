"""Fakes shared by the test folders (one place, so test modules never import each other): scheduler command
runners answering from canned output (tests/data/slurm, tests/data/pbs), a canned Slurm cluster with its own state,
and the provider and executor sides PilotPool talks to."""
import contextlib
import math
from pathlib import Path

from parsl.jobs.states import JobState, JobStatus

from parsl_bft.execution.pilot import Hole

from paths import FIXTURES


def recorded(name: str) -> str:
    """Canned scheduler output kept in tests/data/ (tests/data/README.md says where each was recorded)."""
    return (FIXTURES / name).read_text()


PBS_NODES = recorded("pbs/pbsnodes.json")
PBS_QSTAT = recorded("pbs/qstat.json")


def canned_pbs(calls):
    """A PBS command runner answering pbsnodes, qstat and qsub from tests/data/pbs, logging each argv to ``calls``."""
    def run(argv):
        calls.append(argv)
        if argv[0] == "pbsnodes":
            return 0, PBS_NODES, ""
        if argv[0] == "qstat":
            return 0, PBS_QSTAT, ""
        if argv[0] == "qsub":
            return 0, "1010.polaris-pbs-01\n", ""
        return 0, "", ""
    return run


class Canned:
    """A runner answering each command from recorded output and logging what was asked."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, argv):
        self.calls.append(argv)
        for prefix, ans in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return ans() if callable(ans) else ans
        return 0, "", ""


class FakePilots:
    """The provider and executor sides PilotPool talks to, driven by the test (no scheduler, no Parsl); the
    pool's ``hold`` of a block is recorded (tests/e2e/test_pilot_pool_htex.py holds a real HTEX's block)."""

    label, script_dir, can_target, refused = "fake", None, False, None

    def __init__(self):
        self.notice_s, self.holes_n, self.running, self.claims, self.marks = 20, 0, {}, set(), set()
        self.blocks_to_job_id, self.managers, self.cancelled, self.held = {}, set(), [], []
        self.provider, self.busy, self.surveys, self.slots = self, False, 0, None
        self.sizes, self.multi_node, self.pilot_nodes, self.busy_cancel = {}, False, 1, False
        self.walltime_marks = set()

    def hold(self, executor, block):
        self.held.append(block)

    def pilots(self, shape):                 # the pool's pilots of this shape (PilotProvider.pilots)
        self.pilot_nodes = shape.nodes
        return contextlib.nullcontext()

    def topology(self):
        return None

    # provider
    def holes(self):
        return [Hole(f"h{i}", math.inf) for i in range(self.holes_n)]

    current_holes = holes

    def where(self, ids):
        if self.busy:
            raise RuntimeError("squeue: Socket timed out")
        return {j: ((self.running[j][0],), self.running[j][1]) for j in ids if j in self.running}

    def status(self, ids):
        return [JobStatus(JobState.RUNNING if j in self.running else JobState.SCALED_IN if j in self.cancelled
                          else JobState.PENDING) for j in ids]

    def claimed(self, within_s, now=None):
        return self.claims

    def snapshot(self, max_age_s=None):
        self.surveys += 1

    def job_slots(self):
        return self.slots

    def noticed(self, jid):
        return jid in self.marks

    def walltime_signalled(self, jid):
        return jid in self.walltime_marks

    def cancel(self, ids):
        if self.busy_cancel:
            self.busy_cancel = False
            raise RuntimeError("scancel: Socket timed out")
        self.cancelled += ids
        for j in ids:
            self.running.pop(j, None)

    # executor
    def scale_out_facade(self, n):
        for _ in range(n):
            b = str(len(self.blocks_to_job_id))
            self.blocks_to_job_id[b] = str(100 + int(b))

    def connected_managers(self):
        return [{"block_id": b} for b in self.managers]


class CannedCluster:
    """A 16-node Slurm answering sinfo/squeue/sbatch/scancel/... from its own state, on a test clock: pilots
    start at once on free nodes. Logs (time, command) for what an admin would count."""

    def __init__(self, clock, job_limit=None):
        self.clock, self.jobs, self.log, self.next_id, self.job_limit = clock, {}, [], 100, job_limit

    def __call__(self, argv):
        self.log.append((self.clock(), argv[0] if argv[:2] != ["sbatch", "--test-only"] else "sbatch --test-only"))
        busy = {n for j in self.jobs.values() if j["state"] == "RUNNING" for n in j["nodes"]}
        if argv[0] == "sinfo":
            return 0, "".join(f"n{i}|{'alloc' if f'n{i}' in busy else 'idle'}\n" for i in range(1, 17)), ""
        if argv[0] == "squeue":
            return 0, "".join(f"{j}|{r['state']}|{r['start']:.0f}|{r['start'] + 3600:.0f}|(null)|{r['node']}|None\n"
                              for j, r in self.jobs.items()), ""
        if argv[0] == "sacctmgr":
            return (0, f"{self.job_limit}|\n", "") if self.job_limit else (1, "", "not a supported plugin")
        if argv[:2] == ["sbatch", "--test-only"]:
            return 0, "", ""
        if argv[0] == "sbatch":
            script = Path(argv[1]).read_text()
            n = int(script.split("--nodes=")[1].split()[0])
            free = sorted(set(f"n{i}" for i in range(1, 17)) - busy, key=lambda x: int(x[1:]))
            if "--nodelist=" in script:                 # an aimed pilot starts on the nodes it names
                free = script.split("--nodelist=")[1].split()[0].split(",")
            self.next_id += 1
            self.jobs[str(self.next_id)] = {"state": "RUNNING", "node": ",".join(free[:n]),
                                            "nodes": free[:n], "start": self.clock(), "script": script}
            return 0, f"Submitted batch job {self.next_id}\n", ""
        if argv[0] == "scancel":       # --batch --signal=USR2: the pilot's script ends itself with exit 0
            released = "--signal=USR2" in argv
            for j in (a for a in argv[1:] if not a.startswith("-")):
                self.jobs.get(j, {})["state"] = "COMPLETED" if released else "CANCELLED"
        return 0, "", ""


class CannedExecutor:
    """What PilotPool uses of an HTEX: blocks, scale-out through the provider, connected worker pools."""

    def __init__(self, provider, cluster, label="canned"):
        self.provider, self.cluster, self.blocks_to_job_id, self.label = provider, cluster, {}, label

    def scale_out_facade(self, n):
        for _ in range(n):
            self.blocks_to_job_id[str(len(self.blocks_to_job_id))] = self.provider.submit("pool", 1, "pilot")

    def connected_managers(self):
        return [{"block_id": b} for b, j in self.blocks_to_job_id.items()
                if self.cluster.jobs[j]["state"] == "RUNNING" for _ in self.cluster.jobs[j]["nodes"]]


def no_hold(executor, block):
    """The pools on a canned cluster have no worker pools to hold."""
