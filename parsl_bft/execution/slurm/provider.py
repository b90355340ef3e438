"""Slurm pilots: one-node jobs sized to backfill holes (see ..pilot for the common behaviour)."""
from __future__ import annotations

import getpass
import math
import re
import shlex
import subprocess
import time
from collections.abc import Sequence
from typing import ClassVar

import typeguard
from parsl.jobs.states import JobState
from parsl.utils import RepresentationMixin

from ...sites import SiteError
from ...topology import Topology
from ..commands import SchedulerError
from ..pilot import PilotProvider, PilotShape, Snapshot, locked, node_name
from .commands import ReservationRecord, SlurmCommands, parse_test_only


class SlurmPilotProvider(PilotProvider, RepresentationMixin):
    """``--time`` = ``--time-min`` = the hole (within bounds: on the local Slurm 22.05 pilots with a lower
    --time-min started with that minimum as their limit even with nothing waiting, and spent most of it on notice),
    ``--signal=B:USR1@notice_s`` for the reclaim notice, the site's preemptable QOS when it has one.

    Parameters
    ----------
    partition : str
        The partition pilots go to and whose idle nodes are the holes.
    qos : str or None
        The QOS of the pilots (a preemptable one, where the site has it).
    account : str or None
        The allocation the pilots are charged to (``--account``); None: the user's default.
    constraint, mem, reservation : str or None
        ``--constraint`` (node features), ``--mem`` (per node, with its unit) and ``--reservation`` of every
        pilot; None: not asked.
    grace_s : int or None
        Seconds a pilot's worker gets to save after the scheduler's SIGTERM before the pilot kills it; None: the
        partition's GraceTime (``scontrol show partition``, asked once), else 3.
    commands : SlurmCommands or None
        The command seam (tests pass one that answers from recorded output); None: the real Slurm commands.

    The other parameters are every pilot provider's (``PilotProvider``). ``repr`` is this constructor call.
    """

    # squeue shows a job's flag instead of its base state when one is set (Slurm's job_state_codes): a running
    # pilot being sent its --signal notice is SIGNALING, not RUNNING. Every documented name is here.
    STATES: ClassVar[dict[str, JobState]] = {
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
    multi_node: ClassVar[bool] = True
    can_target: ClassVar[bool] = True
    # reservations are made by hand, hours ahead: a minute-old view is fresh
    RESERVATIONS_EVERY_S: ClassVar[float] = 60.0

    @typeguard.typechecked
    def __init__(self, partition: str = "debug", *, qos: str | None = None, account: str | None = None,
                 commands: SlurmCommands | None = None, walltime_min_min: int = 1, walltime_max_min: int = 30,
                 notice_s: int = 60, max_pending_s: float = 30.0, worker_init: str = "",
                 script_dir: str = "bft-pilots", nodes_per_block: int = 1, poll_s: int = 5,
                 scheduler_options: list[str] | None = None, max_jobs: int | None = None, gpus_per_node: int = 0,
                 constraint: str | None = None, mem: str | None = None, reservation: str | None = None,
                 grace_s: int | None = None):
        super().__init__("slurm_pilot", walltime_min_min=walltime_min_min, walltime_max_min=walltime_max_min,
                         notice_s=notice_s, max_pending_s=max_pending_s, worker_init=worker_init,
                         script_dir=script_dir, nodes_per_block=nodes_per_block, poll_s=poll_s,
                         scheduler_options=scheduler_options, max_jobs=max_jobs)
        self.partition, self.qos, self.account, self.gpus_per_node = partition, qos, account, gpus_per_node
        self.constraint, self.mem, self.reservation, self.grace_s = constraint, mem, reservation, grace_s
        self._grace: int | None = None
        self.commands = commands
        self.cmd: SlurmCommands = commands or SlurmCommands()
        self._reservations: tuple[float, list[ReservationRecord]] | None = None
        self._test_only: tuple[float, int, PilotShape, bool] | None = None

    def survey(self) -> Snapshot:
        """sinfo (the partition's nodes) + squeue (the whole queue), and scontrol's reservations once a
        minute, or at every survey while one that is not the site's own holds nodes: sinfo shows a maintenance
        reservation's nodes idle, and pilots sent there would only queue, be withdrawn and be sent again until
        it ends (or is deleted, early). All waiting jobs count, in any partition: they may want these nodes."""
        now = self.clock()
        if self._reservations is None or now - self._reservations[0] >= self.RESERVATIONS_EVERY_S \
                or self._held_by_others(self._reservations[1], now):
            self._reservations = (now, self.cmd.reservations())
        reserved: dict[str, float] = {}          # a reservation that has not begun takes its nodes then
        for r in self._reservations[1]:
            if r.start is not None and r.start > now:
                for n in r.nodes:
                    reserved[n] = min(reserved.get(n, math.inf), r.start)
        held = self._held_by_others(self._reservations[1], now)
        idle = tuple(n.name for n in self.cmd.nodes(self.partition) if n.usable and n.name not in held)
        jobs = {j.job_id: j for j in self.cmd.queue()}
        return Snapshot(now, idle, jobs, reserved)

    def _held_by_others(self, reservations: list[ReservationRecord], now: float) -> set[str]:
        """Nodes of the reservations under way that are not the site's own (``reservation``): no pilot runs
        there until they end."""
        return {n for r in reservations if r.name != self.reservation and r.start is not None and r.start <= now
                and (r.end is None or r.end > now) for n in r.nodes}

    def ended(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        """Final states from sacct (or the job-completion log)."""
        return {r.job_id: (r.state, r.reason) for r in self.cmd.finished(job_ids) if r.job_id in job_ids}

    @locked
    def walltime_minutes(self, now: float | None = None, shape: PilotShape | None = None) -> int:
        """The hole's length, confirmed with ``sbatch --test-only`` once per survey (one scale-out's pilots
        share it): a pilot that would not start now at that length gets the shortest walltime (backfill may
        still fit it; otherwise it is withdrawn)."""
        shape = shape or self.default_shape()
        minutes = super().walltime_minutes(now, shape)
        taken = self.snapshot().taken
        if self._test_only is None or self._test_only[:3] != (taken, minutes, shape):
            # the job the pilot would be, as command-line arguments (a directive "-C gpu" is two of them)
            start, _ = self.cmd.test_only([a for o in self.job_options(minutes, shape) for a in shlex.split(o)])
            late = start is not None and start > (self.clock() if now is None else now) + 60
            self._test_only = (taken, minutes, shape, late)
        return self.walltime_min_min if self._test_only[3] else minutes

    def preflight(self) -> str:
        """The partition has nodes (``sinfo -p`` of an unknown partition lists none and exits 0), and ``sbatch
        --test-only`` takes a pilot of the longest walltime: what a real submission would be refused for
        (invalid partition, account or QOS, an unsatisfiable request) stops the run before it starts."""
        nodes = self.cmd.nodes(self.partition)
        if not nodes:
            raise SiteError(f"partition '{self.partition}' matches no node (sinfo -p {self.partition} lists none): "
                            "check the site file's 'partition' (sinfo -s lists the partitions)")
        rc, said = self.cmd.try_job([a for o in self.job_options(self.walltime_max_min) for a in shlex.split(o)])
        if rc != 0:
            raise SiteError(f"sbatch --test-only refuses a pilot: {said[:300] or f'exit {rc}'} (check the site "
                            "file's partition, account, preemptable_qos, constraint, mem, reservation and "
                            "scheduler_options; `parsl-bft sites show --pilot-script` prints the pilot's script)")
        start, where = parse_test_only(said)
        idle = sum(n.usable for n in nodes)
        when = f"would start at {time.strftime('%H:%M:%S', time.localtime(start))} on {where}" if start else \
            "takes a pilot"
        return f"partition '{self.partition}': {len(nodes)} nodes, {idle} idle now; sbatch --test-only {when}" + \
            _hidden_words(self.cmd.private_data())

    def job_limit(self) -> int | None:
        """The user's association cap (sacctmgr)."""
        return self.cmd.job_limit(getpass.getuser())

    def read_topology(self) -> Topology | None:
        """``scontrol show topology`` (None without topology/tree)."""
        return self.cmd.topology()

    def on_each_node(self, command: str, nodes: int) -> str:
        """One task per node through srun (a one-node pilot runs the command itself)."""
        return command if nodes == 1 else f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 {command}"

    def job_options(self, minutes: int, shape: PilotShape | None = None) -> list[str]:
        """What a pilot of ``shape`` (default: ``default_shape``) asks Slurm for, ``minutes`` long: partition,
        nodes, time, QOS, account, constraint, memory, reservation, GPUs and the site's options. The pilot's script
        and the ``--test-only`` probe both use it, so the probe tests the job that is submitted."""
        shape = shape or self.default_shape()
        opts = [f"--partition={self.partition}", f"--nodes={shape.nodes}", f"--time={minutes}",
                f"--time-min={minutes}", "--exclusive"]
        opts += [f"--nodelist={','.join(map(node_name, shape.target))}"] if shape.target else []
        opts += [f"--qos={self.qos}"] if self.qos else []
        opts += [f"--account={self.account}"] if self.account else []
        opts += [f"--{k}={v}" for k, v in (("constraint", self.constraint), ("mem", self.mem),
                                           ("reservation", self.reservation)) if v]
        asks_gpus = any(re.match(r"(--gpus|--gres|-G\b)", o) for o in self.scheduler_options)   # the site asks
        opts += [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node and not asks_gpus else []
        return opts + self.scheduler_options

    def grace(self) -> int:
        """Seconds the pilot's TERM trap waits for the worker to save before killing it: ``grace_s``, else the
        partition's GraceTime (asked once; Slurm's own wait between SIGTERM and SIGKILL of a preempted job), else
        3 (GraceTime 0, or scontrol cannot be asked)."""
        if self._grace is None:
            found = self.grace_s
            if found is None:
                try:
                    found = self.cmd.grace_time(self.partition)
                except (SchedulerError, OSError, subprocess.SubprocessError):
                    found = None
            self._grace = found or 3
        return self._grace

    @locked
    def cancel(self, job_ids: Sequence[object]) -> list[bool]:
        """Give pilots back: running ones are asked to end themselves (``SlurmCommands.release``: their script
        stops the worker and exits 0, so accounting says COMPLETED, not CANCELLED; the trap bounds that by
        ``grace()``), queued ones are cancelled. Either way they count as withdrawn from now on."""
        ids = [str(j) for j in job_ids]
        running = set(self.where(ids))
        self.cmd.release(sorted(running))
        self.cmd.cancel([j for j in ids if j not in running])
        self.withdrawn.update(ids)
        return [True] * len(ids)

    def script(self, command: str, job_name: str, minutes: int, shape: PilotShape | None = None) -> str:
        """The sbatch script of a pilot of ``shape`` (aimed with --nodelist when it has a target): never
        requeued (a requeued pilot would start again for nobody, its fragment's ranks gone)."""
        shape = shape or self.default_shape()
        opts = [f"--job-name={job_name}", *self.job_options(minutes, shape), f"--signal=B:USR1@{self.notice_s}",
                "--no-requeue", f"--output={self.directive_path(f'{self.script_dir}/%j.out')}"]
        lines = ["#!/bin/bash", *[f"#SBATCH {o}" for o in opts], self.worker_init, self.QUIET_TRACKER,
                 f"setsid {self.on_each_node(command, shape.nodes)} &",
                 *self.notice_trap("SLURM_JOB_ID", self.grace())]
        return "\n".join(line for line in lines if line) + "\n"


def _hidden_words(hidden: set[str]) -> str:
    """What Slurm's PrivateData means for the survey, said at start-up (nothing when it hides nothing we read)."""
    if "jobs" not in hidden:
        return ""
    return ("; PrivateData=jobs: other users' queued jobs are hidden, so holes come from sinfo and reservations "
            "alone and a pilot may take nodes a hidden job was planned on (pilots belong on a preemptable QOS)")
