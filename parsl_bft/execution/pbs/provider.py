"""PBS Pro pilots (e.g. ALCF Polaris's preemptable queue): one-node jobs sized to the holes."""
from __future__ import annotations

from typing import ClassVar

import typeguard
from parsl.jobs.states import JobState
from parsl.utils import RepresentationMixin

from ...sites import SiteError
from ...topology import Topology
from ..pilot import PilotProvider, PilotShape, QueueJob, Snapshot, node_name
from .commands import PBSCommands, PBSJob


class PBSPilotProvider(PilotProvider, RepresentationMixin):
    """``walltime`` = the hole (within bounds); PBS sends SIGTERM before killing a job that reaches its
    walltime or is preempted, which the pilot script treats as the reclaim notice.

    Parameters
    ----------
    queue : str
        The queue pilots go to (a preemptable one, where the site has it).
    account : str or None
        The project the pilots are charged to (``-A``); None: the user's default.
    select : str
        A pilot's ``-l select=`` chunk (one node: ``1:ncpus=...:ngpus=...``).
    commands : PBSCommands or None
        The command seam (tests pass one that answers from recorded output); None: the real PBS commands.

    The other parameters are every pilot provider's (``PilotProvider``). ``repr`` is this constructor call.
    """

    STATES: ClassVar[dict[str, JobState]] = {
        "Q": JobState.PENDING, "W": JobState.PENDING, "T": JobState.PENDING, "H": JobState.HELD,
        "S": JobState.HELD, "U": JobState.HELD, "R": JobState.RUNNING, "B": JobState.RUNNING,
        "E": JobState.RUNNING, "X": JobState.COMPLETED,
        # finished jobs, classified by _queue_job from their exit status and comment
        "TIMEOUT": JobState.TIMEOUT, "SCALED_IN": JobState.SCALED_IN, "FAILED": JobState.FAILED}
    can_target: ClassVar[bool] = True

    @typeguard.typechecked
    def __init__(self, queue: str, *, account: str | None = None, select: str = "1:ncpus=1",
                 commands: PBSCommands | None = None, walltime_min_min: int = 1, walltime_max_min: int = 30,
                 notice_s: int = 60, max_pending_s: float = 30.0, worker_init: str = "",
                 script_dir: str = "bft-pilots", nodes_per_block: int = 1, poll_s: int = 5,
                 scheduler_options: list[str] | None = None, max_jobs: int | None = None):
        super().__init__("pbs_pilot", walltime_min_min=walltime_min_min, walltime_max_min=walltime_max_min,
                         notice_s=notice_s, max_pending_s=max_pending_s, worker_init=worker_init,
                         script_dir=script_dir, nodes_per_block=nodes_per_block, poll_s=poll_s,
                         scheduler_options=scheduler_options, max_jobs=max_jobs)
        self.queue, self.account, self.select = queue, account, select
        self.commands = commands
        self.cmd: PBSCommands = commands or PBSCommands()

    def survey(self) -> Snapshot:
        """pbsnodes (free nodes) + qstat (the whole queue, with the scheduler's estimated starts)."""
        idle = tuple(n.name for n in self.cmd.nodes() if n.usable)
        jobs = {j.job_id: _queue_job(j) for j in self.cmd.queue()}
        return Snapshot(self.clock(), idle, jobs, waiting_states=frozenset({"Q"}),
                        running_states=frozenset({"R", "E"}),
                        waits_for_nodes=frozenset())    # its comments are sentences: no word says it

    def ended(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        """Final states from the server's job history (qstat -x)."""
        finals = [_queue_job(j) for j in self.cmd.history(job_ids)]
        return {q.job_id: (q.state, q.reason) for q in finals if q.job_id in job_ids}

    def preflight(self) -> str:
        """The queue exists and takes jobs (``qstat -Q``): an unknown or disabled queue stops the run before it
        starts (PBS has no test-only submission; a refused pilot is caught by three refusals in a row)."""
        rc, attrs, said = self.cmd.queue_info(self.queue)
        if rc != 0:
            raise SiteError(f"queue '{self.queue}' is unknown to PBS (qstat -Q {self.queue}: "
                            f"{said[:300] or f'exit {rc}'}): check the site file's 'queue' (qstat -Q lists the "
                            "queues)")
        off = [k for k in ("enabled", "started") if str(attrs.get(k, "True")).lower() in ("false", "0")]
        if off:
            raise SiteError(f"queue '{self.queue}' takes no jobs now ({' and '.join(k + ' = False' for k in off)}): "
                            "name another queue in the site file's 'queue', or ask the admins")
        return f"queue '{self.queue}': known to PBS, enabled and started"

    def job_limit(self) -> int | None:
        """The per-user cap of the queue and the server."""
        return self.cmd.job_limit(self.queue)

    def read_topology(self) -> Topology:
        """The vnodes' placement sets (``pbsnodes -a -F json``: switch, tier0, ...)."""
        return self.cmd.topology()

    def script(self, command: str, job_name: str, minutes: int, shape: PilotShape | None = None) -> str:
        """The qsub script of a pilot (its chunk names its host when the pilot is aimed: ``shape.target``)."""
        shape = shape or self.default_shape()
        select = self.select
        if shape.target:             # one-node pilots: the chunk names its host
            (node,) = shape.target
            select += f":host={node_name(node)}"
        opts = [f"-N {job_name}", f"-q {self.queue}", f"-l select={select}",
                f"-l walltime={minutes // 60:02d}:{minutes % 60:02d}:00", "-j oe", "-r n",   # never rerun
                f"-o {self.directive_path(f'{self.script_dir}/')}"]
        opts += [f"-A {self.account}"] if self.account else []
        lines = ["#!/bin/bash", *[f"#PBS {o}" for o in opts + self.scheduler_options], self.worker_init,
                 self.QUIET_TRACKER,
                 f"setsid {self.on_each_node(command, shape.nodes)} &", *self.notice_trap("PBS_JOBID")]
        return "\n".join(line for line in lines if line) + "\n"


def _queue_job(j: PBSJob) -> QueueJob:
    """A qstat record as the snapshot holds it; a finished job (F, X) gets the state its exit status and comment
    tell: walltime end, a signal (qdel, preemption, PBS itself), success or failure."""
    state = j.state
    if state in ("F", "X"):
        if "walltime" in j.comment.lower():
            state = "TIMEOUT"
        elif j.exit_status == 0:
            state = "X"
        elif j.exit_status is not None and (j.exit_status >= 256 or j.exit_status < 0):
            state = "SCALED_IN"
        else:
            state = "FAILED"
    waiting = state == "Q"
    return QueueJob(j.job_id, state, j.comment, j.estimated_start if waiting else None, j.end,
                    j.planned_nodes if waiting else j.hosts, j.nodes, j.walltime)
