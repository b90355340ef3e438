"""PBS Pro pilots (e.g. ALCF Polaris's preemptable queue): one-node jobs sized to the holes."""
from __future__ import annotations

import math

from parsl.jobs.states import JobState

from ..pilot import Hole, PilotProvider
from .commands import PBSCommands


def find_holes(cmd: PBSCommands, mine=()) -> list[Hole]:
    """Free nodes now, held until the earliest estimated start of a queued job (PBS's backfill plan; any queue,
    not our own pilots)."""
    idle = [n.name for n in cmd.nodes() if n.usable]
    starts = [j.estimated_start for j in cmd.queued() if j.estimated_start is not None and j.job_id not in mine]
    until = min(starts) if starts else math.inf
    return [Hole(n, until) for n in idle]


class PBSPilotProvider(PilotProvider):
    """``walltime`` = the hole (within bounds); PBS sends SIGTERM before killing a job that reaches its
    walltime or is preempted, which the pilot script treats as the reclaim notice."""

    STATES = {"Q": JobState.PENDING, "W": JobState.PENDING, "T": JobState.PENDING, "H": JobState.HELD,
              "S": JobState.HELD, "U": JobState.HELD, "R": JobState.RUNNING, "B": JobState.RUNNING,
              "E": JobState.RUNNING, "X": JobState.COMPLETED,
              # finished jobs, classified by _states from their exit status and comment
              "TIMEOUT": JobState.TIMEOUT, "SCALED_IN": JobState.SCALED_IN, "FAILED": JobState.FAILED}

    def __init__(self, queue: str, *, account: str | None = None, select: str = "1:ncpus=1",
                 commands: PBSCommands | None = None, **kw):
        super().__init__(**kw)
        self.queue, self.account, self.select = queue, account, select
        self.cmd = commands or PBSCommands()

    @property
    def label(self) -> str:
        return "pbs_pilot"

    def holes(self) -> list[Hole]:
        return find_holes(self.cmd, self.submitted)

    def waiting(self) -> list[tuple[str, float | None, tuple[str, ...]]]:
        return [(j.job_id, j.estimated_start, j.planned_nodes) for j in self.cmd.queued()]

    def script(self, command: str, job_name: str, minutes: int) -> str:
        opts = [f"-N {job_name}", f"-q {self.queue}", f"-l select={self.select}",
                f"-l walltime={minutes // 60:02d}:{minutes % 60:02d}:00", "-j oe", f"-o {self.script_dir}/"]
        opts += [f"-A {self.account}"] if self.account else []
        lines = ["#!/bin/bash", *[f"#PBS {o}" for o in opts + self.scheduler_options], self.worker_init,
                 f"setsid {command} &", *self.notice_trap("PBS_JOBID")]
        return "\n".join(line for line in lines if line) + "\n"

    def where(self, job_ids: list[str]) -> dict[str, tuple[str, float | None]]:
        return {j.job_id: (j.node, j.end) for j in self.cmd.jobs(job_ids) if j.state == "R" and j.node}

    def _states(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        out = {}
        for j in self.cmd.jobs(job_ids):
            state = j.state
            if state in ("F", "X"):          # finished (history): the exit status and comment tell how
                if "walltime" in j.comment.lower():
                    state = "TIMEOUT"
                elif j.exit_status == 0:
                    state = "X"
                elif j.exit_status is not None and (j.exit_status >= 256 or j.exit_status < 0):
                    state = "SCALED_IN"      # killed by a signal (qdel, preemption) or by PBS itself
                else:
                    state = "FAILED"
            out[j.job_id] = (state, j.comment)
        return out
