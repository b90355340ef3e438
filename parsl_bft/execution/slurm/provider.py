"""Slurm pilots: one-node jobs sized to backfill holes (see ..pilot for the common behaviour)."""
from __future__ import annotations

import getpass
import math

from parsl.jobs.states import JobState

from ...topology import Topology
from ..pilot import PilotProvider, Snapshot, node_name
from .commands import SlurmCommands


class SlurmPilotProvider(PilotProvider):
    """``--time`` = ``--time-min`` = the hole (within bounds: on the local Slurm 22.05 pilots with a lower
    --time-min started with that minimum as their limit even with nothing waiting, and spent most of it on notice),
    ``--signal=B:USR1@notice_s`` for the reclaim notice, the site's preemptable QOS when it has one."""

    # squeue shows a job's flag instead of its base state when one is set (Slurm's job_state_codes): a running
    # pilot being sent its --signal notice is SIGNALING, not RUNNING. Every documented name is here.
    STATES = {
        "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
        "REQUEUE_FED": JobState.PENDING, "POWER_UP_NODE": JobState.PENDING, "EXPEDITING": JobState.PENDING,
        "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
        "RESIZING": JobState.RUNNING, "STAGE_OUT": JobState.RUNNING, "UPDATE_DB": JobState.RUNNING,
        "SUSPENDED": JobState.HELD, "STOPPED": JobState.HELD, "REQUEUE_HOLD": JobState.HELD,
        "SPECIAL_EXIT": JobState.HELD, "RESV_DEL_HOLD": JobState.HELD,
        "COMPLETED": JobState.COMPLETED, "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT,
        "CANCELLED": JobState.SCALED_IN, "PREEMPTED": JobState.SCALED_IN, "NODE_FAIL": JobState.SCALED_IN,
        "BOOT_FAIL": JobState.SCALED_IN, "REVOKED": JobState.SCALED_IN, "FAILED": JobState.FAILED,
        "OUT_OF_MEMORY": JobState.FAILED, "LAUNCH_FAILED": JobState.FAILED, "RECONFIG_FAIL": JobState.FAILED,
    }

    def __init__(self, partition: str = "debug", *, qos: str | None = None, account: str | None = None,
                 commands: SlurmCommands | None = None, **kw):
        super().__init__(**kw)
        self.partition, self.qos, self.account = partition, qos, account
        self.cmd = commands or SlurmCommands()
        self._reservations: tuple[float, list] | None = None
        self._test_only: tuple[float, int, int, bool] | None = None

    RESERVATIONS_EVERY_S = 60.0     # reservations are made by hand, hours ahead: a minute-old view is fresh

    @property
    def label(self) -> str:
        return "slurm_pilot"

    def survey(self) -> Snapshot:
        """sinfo (the partition's nodes) + squeue (the whole queue), and scontrol's reservations once a
        minute. All waiting jobs count, in any partition: they may want these nodes."""
        now = self.clock()
        if self._reservations is None or now - self._reservations[0] >= self.RESERVATIONS_EVERY_S:
            self._reservations = (now, self.cmd.reservations())
        reserved: dict[str, float] = {}          # a reservation that has not begun takes its nodes then
        for r in self._reservations[1]:
            if r.start is not None and r.start > now:
                for n in r.nodes:
                    reserved[n] = min(reserved.get(n, math.inf), r.start)
        idle = tuple(n.name for n in self.cmd.nodes(self.partition) if n.usable)
        jobs = {j.job_id: j for j in self.cmd.queue()}
        return Snapshot(now, idle, jobs, reserved)

    def ended(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        return {r.job_id: (r.state, r.reason) for r in self.cmd.finished(job_ids) if r.job_id in job_ids}

    def walltime_minutes(self, now: float | None = None) -> int:
        """The hole's length, confirmed with ``sbatch --test-only`` once per survey (one scale-out's pilots
        share it): a pilot that would not start now at that length gets the shortest walltime (backfill may
        still fit it; otherwise it is withdrawn)."""
        minutes = super().walltime_minutes(now)
        taken = self.snapshot().taken
        if self._test_only is None or self._test_only[:3] != (taken, minutes, self.pilot_nodes):
            start, _ = self.cmd.test_only([f"--partition={self.partition}", f"--nodes={self.pilot_nodes}",
                                           f"--time={minutes}", "--exclusive"])
            late = start is not None and start > (self.clock() if now is None else now) + 60
            self._test_only = (taken, minutes, self.pilot_nodes, late)
        return self.walltime_min_min if self._test_only[3] else minutes

    def job_limit(self) -> int | None:
        return self.cmd.job_limit(getpass.getuser())

    multi_node = True
    can_target = True

    def read_topology(self) -> Topology | None:
        """``scontrol show topology`` (None without topology/tree)."""
        return self.cmd.topology()

    def on_each_node(self, command: str, nodes: int) -> str:
        return command if nodes == 1 else f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 {command}"

    def script(self, command: str, job_name: str, minutes: int) -> str:
        opts = [f"--job-name={job_name}", f"--partition={self.partition}", f"--nodes={self.pilot_nodes}",
                f"--time={minutes}", f"--time-min={minutes}", f"--signal=B:USR1@{self.notice_s}",
                "--exclusive", f"--output={self.directive_path(self.script_dir + '/%j.out')}"]
        opts += [f"--nodelist={','.join(map(node_name, self.pilot_target))}"] if self.pilot_target else []
        opts += [f"--qos={self.qos}"] if self.qos else []
        opts += [f"--account={self.account}"] if self.account else []
        lines = ["#!/bin/bash", *[f"#SBATCH {o}" for o in opts + self.scheduler_options], self.worker_init,
                 f"setsid {self.on_each_node(command, self.pilot_nodes)} &", *self.notice_trap("SLURM_JOB_ID")]
        return "\n".join(line for line in lines if line) + "\n"
