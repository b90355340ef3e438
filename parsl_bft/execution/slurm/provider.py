"""A Parsl provider whose blocks are pilot jobs that soak up Slurm's backfill holes."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from parsl.jobs.states import JobState, JobStatus
from parsl.providers.base import ExecutionProvider

from .commands import SlurmCommands

# Slurm states -> Parsl: a pilot that was reclaimed, preempted or ran out of its hole is a normal end of an
# idle window, never FAILED (Parsl marks an executor broken when all its blocks fail).
_STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.HELD,
    "COMPLETED": JobState.COMPLETED, "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT,
    "CANCELLED": JobState.SCALED_IN, "PREEMPTED": JobState.SCALED_IN, "NODE_FAIL": JobState.SCALED_IN,
    "BOOT_FAIL": JobState.SCALED_IN, "FAILED": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED,
}


@dataclass(frozen=True)
class Hole:
    node: str
    until: float          # unix time the node is expected to be taken back (inf: no pending job needs it)


def find_holes(cmd: SlurmCommands, partition: str) -> list[Hole]:
    """Idle nodes now, and how long they stay idle: until the earliest planned start of a pending job in the
    partition (squeue --start), which is when backfill will want them back. Conservative: all idle nodes are
    assumed needed at that time."""
    idle = [n.name for n in cmd.nodes(partition) if n.usable]
    starts = [p.planned_start for p in cmd.pending(partition) if p.planned_start is not None]
    until = min(starts) if starts else math.inf
    return [Hole(n, until) for n in idle]


class SlurmPilotProvider(ExecutionProvider):
    """Pilot jobs of one node each (so single nodes can come and go) sized to the holes.

    Each pilot asks ``--time`` = the hole's length (at most ``walltime_max_min``) with ``--time-min`` so backfill
    may shorten it to fit, ``--signal=B:USR1@notice_s`` for a reclaim notice, and the site's preemptable QOS or
    partition. Pilots still pending after ``max_pending_s`` are withdrawn (a queued pilot competes with the
    facility's jobs) and reported SCALED_IN.
    """

    def __init__(self, partition: str = "debug", *, qos: str | None = None, account: str | None = None,
                 walltime_min_min: int = 1, walltime_max_min: int = 30, notice_s: int = 60,
                 max_pending_s: float = 30.0, worker_init: str = "", script_dir: str = "bft-pilots",
                 nodes_per_block: int = 1, commands: SlurmCommands | None = None, poll_s: int = 5,
                 scheduler_options: list[str] | None = None):
        if walltime_min_min < 1 or walltime_max_min < walltime_min_min:
            raise ValueError(f"pilot walltime bounds must satisfy 1 <= min <= max, got {walltime_min_min}, "
                             f"{walltime_max_min}")
        self.partition, self.qos, self.account = partition, qos, account
        self.walltime_min_min, self.walltime_max_min, self.notice_s = walltime_min_min, walltime_max_min, notice_s
        self.max_pending_s, self.worker_init, self.script_dir = max_pending_s, worker_init, script_dir
        self.nodes_per_block = nodes_per_block
        self.scheduler_options = list(scheduler_options or [])
        self.cmd = commands or SlurmCommands()
        self._poll_s = poll_s
        self.submitted: dict[str, float] = {}
        self.withdrawn: set[str] = set()
        self.resources: dict = {}
        self.cores_per_node: int | None = None
        self.mem_per_node: float | None = None
        # Parsl's block bookkeeping reads these
        self.init_blocks, self.min_blocks, self.max_blocks, self.parallelism = 0, 0, 1_000_000, 1

    @property
    def label(self) -> str:
        return "slurm_pilot"

    @property
    def status_polling_interval(self) -> int:
        return self._poll_s                     # seconds, not Parsl's 60: holes last minutes

    def walltime_minutes(self, now: float | None = None) -> int:
        """The pilot's --time: the current hole's length in whole minutes, within the configured bounds."""
        holes = find_holes(self.cmd, self.partition)
        now = time.time() if now is None else now
        left = min((h.until for h in holes), default=math.inf) - now
        minutes = self.walltime_max_min if math.isinf(left) else int(left // 60)
        return max(self.walltime_min_min, min(self.walltime_max_min, minutes))

    def script(self, command: str, job_name: str, minutes: int) -> str:
        opts = [f"--job-name={job_name}", f"--partition={self.partition}", f"--nodes={self.nodes_per_block}",
                f"--time={minutes}", f"--time-min={self.walltime_min_min}", f"--signal=B:USR1@{self.notice_s}",
                "--exclusive", f"--output={self.script_dir}/%j.out"]
        if self.qos:
            opts.append(f"--qos={self.qos}")
        if self.account:
            opts.append(f"--account={self.account}")
        opts.extend(self.scheduler_options)
        lines = ["#!/bin/bash", *[f"#SBATCH {o}" for o in opts], self.worker_init,
                 # the batch shell gets the notice: pass it on to the worker's process group, note it, and end
                 # cleanly - running into the end of a hole is the normal end of a pilot, not a failure
                 f"trap 'touch {self.script_dir}/$SLURM_JOB_ID.noticed; kill -USR1 -- -$CHILD 2>/dev/null' USR1",
                 f"setsid {command} &", "CHILD=$!",
                 "wait $CHILD; rc=$?",
                 "while kill -0 $CHILD 2>/dev/null; do wait $CHILD; rc=$?; done",
                 f"[ -e {self.script_dir}/$SLURM_JOB_ID.noticed ] && exit 0", "exit $rc"]
        return "\n".join(line for line in lines if line) + "\n"

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.bft") -> str:
        d = Path(self.script_dir)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{job_name}.{time.monotonic_ns()}.sh"
        path.write_text(self.script(command, job_name, self.walltime_minutes()))
        os.chmod(path, 0o755)
        job_id = self.cmd.submit(str(path))
        self.submitted[job_id] = time.time()
        return job_id

    def status(self, job_ids) -> list[JobStatus]:
        ids = [str(j) for j in job_ids]
        seen = {r.job_id: r for r in self.cmd.jobs(ids)}
        missing = [j for j in ids if j not in seen]
        if missing:
            seen.update({r.job_id: r for r in self.cmd.finished() if r.job_id in missing})
        stale = [j for j in ids if j in seen and seen[j].state == "PENDING"
                 and time.time() - self.submitted.get(j, time.time()) > self.max_pending_s]
        if stale:
            self.cmd.cancel(stale)
            self.withdrawn.update(stale)
        out = []
        for j in ids:
            if j in self.withdrawn:
                out.append(JobStatus(JobState.SCALED_IN, "withdrawn: did not start within the hole"))
            elif j in seen:
                r = seen[j]
                state = _STATES.get(r.state.split()[0].rstrip("+"), JobState.UNKNOWN)
                if state == JobState.COMPLETED and (Path(self.script_dir) / f"{j}.noticed").exists():
                    state = JobState.TIMEOUT          # it ended at its notice: the hole closed
                out.append(JobStatus(state, r.reason))
            else:
                out.append(JobStatus(JobState.MISSING, "not known to squeue or the completion log"))
        return out

    def cancel(self, job_ids) -> list[bool]:
        self.cmd.cancel([str(j) for j in job_ids])
        self.withdrawn.update(str(j) for j in job_ids)
        return [True] * len(job_ids)
