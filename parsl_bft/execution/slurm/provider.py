"""Slurm pilots: one-node jobs sized to backfill holes (see ..pilot for the common behaviour)."""
from __future__ import annotations

import math
import time

from parsl.jobs.states import JobState

from ..pilot import Hole, PilotProvider
from .commands import SlurmCommands


def find_holes(cmd: SlurmCommands, partition: str, mine=()) -> list[Hole]:
    """Idle nodes of the partition now, and how long they stay idle: until the earliest planned start of a
    pending job (squeue --start; any partition, not our own pilots), which is when backfill will want them back.
    Conservative: all idle nodes are assumed needed at that time. A reservation that has not begun yet ends
    the hole of its nodes at its start."""
    idle = [n.name for n in cmd.nodes(partition) if n.usable]
    starts = [p.planned_start for p in cmd.pending() if p.planned_start is not None and p.job_id not in mine]
    until = min(starts) if starts else math.inf
    now = time.time()
    reserved: dict[str, float] = {}                  # a reservation that has not begun takes its nodes then
    for r in cmd.reservations():
        if r.start is not None and r.start > now:
            for n in r.nodes:
                reserved[n] = min(reserved.get(n, math.inf), r.start)
    return [Hole(n, min(until, reserved.get(n, math.inf))) for n in idle]


class SlurmPilotProvider(PilotProvider):
    """``--time`` = the hole (within bounds) with ``--time-min`` so backfill may shorten it,
    ``--signal=B:USR1@notice_s`` for the reclaim notice, the site's preemptable QOS when it has one."""

    STATES = {
        "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
        "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.HELD,
        "COMPLETED": JobState.COMPLETED, "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT,
        "CANCELLED": JobState.SCALED_IN, "PREEMPTED": JobState.SCALED_IN, "NODE_FAIL": JobState.SCALED_IN,
        "BOOT_FAIL": JobState.SCALED_IN, "FAILED": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED,
    }

    def __init__(self, partition: str = "debug", *, qos: str | None = None, account: str | None = None,
                 commands: SlurmCommands | None = None, **kw):
        super().__init__(**kw)
        self.partition, self.qos, self.account = partition, qos, account
        self.cmd = commands or SlurmCommands()

    @property
    def label(self) -> str:
        return "slurm_pilot"

    def holes(self) -> list[Hole]:
        return find_holes(self.cmd, self.partition, self.submitted)

    def walltime_minutes(self, now: float | None = None) -> int:
        """The hole's length, confirmed with ``sbatch --test-only``: a pilot that would not start now at that
        length gets the shortest walltime (backfill may still fit it; otherwise it is withdrawn)."""
        minutes = super().walltime_minutes(now)
        start, _ = self.cmd.test_only([f"--partition={self.partition}", "--nodes=1", f"--time={minutes}",
                                       "--exclusive"])
        if start is not None and start > (time.time() if now is None else now) + 60:
            return self.walltime_min_min
        return minutes

    def waiting(self) -> list[tuple[str, float | None, tuple[str, ...]]]:
        return [(p.job_id, p.planned_start, p.sched_nodes) for p in self.cmd.pending()]

    def script(self, command: str, job_name: str, minutes: int) -> str:
        opts = [f"--job-name={job_name}", f"--partition={self.partition}", f"--nodes={self.nodes_per_block}",
                f"--time={minutes}", f"--time-min={self.walltime_min_min}", f"--signal=B:USR1@{self.notice_s}",
                "--exclusive", f"--output={self.script_dir}/%j.out"]
        opts += [f"--qos={self.qos}"] if self.qos else []
        opts += [f"--account={self.account}"] if self.account else []
        lines = ["#!/bin/bash", *[f"#SBATCH {o}" for o in opts + self.scheduler_options], self.worker_init,
                 f"setsid {command} &", *self.notice_trap("SLURM_JOB_ID")]
        return "\n".join(line for line in lines if line) + "\n"

    def where(self, job_ids: list[str]) -> dict[str, tuple[str, float | None]]:
        return {r.job_id: (r.reason, r.end) for r in self.cmd.jobs(job_ids)
                if r.state.startswith("RUNNING") and r.reason}

    def _states(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        seen = {r.job_id: (r.state.split()[0].rstrip("+"), r.reason) for r in self.cmd.jobs(job_ids)}
        if any(j not in seen for j in job_ids):
            gone = [j for j in job_ids if j not in seen]
            seen.update({r.job_id: (r.state, "") for r in self.cmd.finished(gone) if r.job_id in gone})
        return seen
