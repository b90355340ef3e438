"""The scheduler-independent part of a pilot-job provider: Parsl blocks that are pilots soaking up holes.

Subclasses (one sub-package per scheduler) set ``self.cmd`` (their command seam, with ``submit(script)`` and
``cancel(ids)``) and supply the hooks: find the holes, write the batch script, read job states. This base sizes pilots to the current hole, withdraws pilots that do not start
promptly (a queued pilot competes with the facility's jobs) and reports every normal end of an idle window -
reclaimed, preempted, out of its hole - as TIMEOUT or SCALED_IN, never FAILED (Parsl marks an executor broken
when all its blocks fail).
"""
from __future__ import annotations

import math
import os
import time
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path

from parsl.jobs.states import JobState, JobStatus
from parsl.providers.base import ExecutionProvider


@dataclass(frozen=True)
class Hole:
    node: str
    until: float          # unix time the node is expected to be taken back (inf: no queued job needs it)


class PilotProvider(ExecutionProvider):
    STATES: dict[str, JobState] = {}

    def __init__(self, *, walltime_min_min: int = 1, walltime_max_min: int = 30, notice_s: int = 60,
                 max_pending_s: float = 30.0, worker_init: str = "", script_dir: str = "bft-pilots",
                 nodes_per_block: int = 1, poll_s: int = 5, scheduler_options: list[str] | None = None):
        if walltime_min_min < 1 or walltime_max_min < walltime_min_min:
            raise ValueError(f"pilot walltime bounds must satisfy 1 <= min <= max, got {walltime_min_min}, "
                             f"{walltime_max_min}")
        self.walltime_min_min, self.walltime_max_min, self.notice_s = walltime_min_min, walltime_max_min, notice_s
        # absolute: pilot scripts run in whatever directory the scheduler starts them in
        self.max_pending_s, self.worker_init = max_pending_s, worker_init
        self.script_dir = str(Path(script_dir).resolve())
        self.nodes_per_block = nodes_per_block
        self.scheduler_options = list(scheduler_options or [])
        self._poll_s = poll_s
        self._holes: tuple[float, list[Hole]] | None = None    # one hole survey per poll cycle, not per pilot
        self.submitted: dict[str, float] = {}
        self.withdrawn: set[str] = set()
        # what Parsl's block bookkeeping reads
        self.resources: dict = {}
        self.cores_per_node: int | None = None
        self.mem_per_node: float | None = None
        self.init_blocks, self.min_blocks, self.max_blocks, self.parallelism = 0, 0, 1_000_000, 1

    # --- hooks ------------------------------------------------------------------------------------------
    @abstractmethod
    def holes(self) -> list[Hole]: ...

    @abstractmethod
    def script(self, command: str, job_name: str, minutes: int) -> str: ...

    @abstractmethod
    def waiting(self) -> list[tuple[str, float | None, tuple[str, ...]]]:
        """The scheduler's waiting jobs: (job id, planned start or None, nodes it is planned on)."""

    @abstractmethod
    def where(self, job_ids: list[str]) -> dict[str, tuple[str, float | None]]:
        """job id -> (its node, unix time its walltime ends) for the pilots that run now."""

    @abstractmethod
    def _states(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        """job id -> (scheduler state, reason) for the jobs the scheduler still knows."""

    # --- Parsl's provider interface ---------------------------------------------------------------------
    @property
    def status_polling_interval(self) -> int:
        return self._poll_s                     # seconds, not Parsl's 60: holes last minutes

    def current_holes(self) -> list[Hole]:
        """``holes()``, asked of the scheduler at most once per ``status_polling_interval``: one scale-out's
        pilots (and the pool's count of holes before it) share one survey (3 whole-cluster queries on Slurm)."""
        t = time.monotonic()
        if self._holes is None or t - self._holes[0] >= self._poll_s:
            self._holes = (t, self.holes())
        return self._holes[1]

    def walltime_minutes(self, now: float | None = None) -> int:
        """The pilot's walltime: the current hole's length in whole minutes, within the configured bounds."""
        now = time.time() if now is None else now
        left = min((h.until for h in self.current_holes()), default=math.inf) - now
        minutes = self.walltime_max_min if math.isinf(left) else int(left // 60)
        return max(self.walltime_min_min, min(self.walltime_max_min, minutes))

    def notice_trap(self, job_id_var: str) -> list[str]:
        """Shell lines: run the worker in its own process group; the notice signal (USR1) only marks the pilot
        (the orchestrator sees the mark and has the fragment checkpoint; the worker keeps serving until then);
        TERM - the scheduler ending the job - is passed on, so ranks still save what they can, and 3 s later
        the whole group is killed: nothing may outlive its pilot (on sites without cgroups a process that left
        the job's process tree would). Running into the end of a hole is a pilot's normal end."""
        mark = f"{self.script_dir}/${job_id_var}.noticed"
        return [f"trap 'touch {mark}' USR1", f"trap 'touch {mark}; kill -TERM -- -$CHILD 2>/dev/null; sleep 3; kill -KILL -- -$CHILD 2>/dev/null' TERM",
                "CHILD=$!", "wait $CHILD; rc=$?",
                "while kill -0 $CHILD 2>/dev/null; do wait $CHILD; rc=$?; done",
                f"[ -e {mark} ] && exit 0", "exit $rc"]

    def claimed(self, within_s: float, now: float | None = None) -> set[str]:
        """Nodes a waiting facility job (not one of our pilots) is planned to start on within ``within_s``:
        give them back now."""
        soon = (time.time() if now is None else now) + within_s
        return {n for jid, start, nodes in self.waiting() if jid not in self.submitted and start is not None
                and start <= soon for n in nodes}

    def noticed(self, job_id: str) -> bool:
        """Has the scheduler sent this pilot its notice (or begun ending it)?"""
        return (Path(self.script_dir) / f"{job_id}.noticed").exists()

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
        seen = self._states(ids)
        stale = [j for j in ids if j in seen and self.STATES.get(seen[j][0]) == JobState.PENDING
                 and time.time() - self.submitted.get(j, time.time()) > self.max_pending_s]
        if stale:
            self.cmd.cancel(stale)
            self.withdrawn.update(stale)
        out = []
        for j in ids:
            if j in self.withdrawn:
                out.append(JobStatus(JobState.SCALED_IN, "withdrawn: did not start within the hole"))
            elif j in seen:
                raw, reason = seen[j]
                state = self.STATES.get(raw, JobState.UNKNOWN)
                if state == JobState.COMPLETED and self.noticed(j):
                    state = JobState.TIMEOUT          # it ended at its notice: the hole closed
                out.append(JobStatus(state, reason))
            else:
                out.append(JobStatus(JobState.MISSING, "not known to the scheduler"))
        return out

    def cancel(self, job_ids) -> list[bool]:
        self.cmd.cancel([str(j) for j in job_ids])
        self.withdrawn.update(str(j) for j in job_ids)
        return [True] * len(job_ids)
