"""Every Slurm command parsl-bft runs goes through ``SlurmCommands``: build argv -> run -> parse into typed
records (Balsam's scheduler-interface shape). Tests feed recorded output through the same parsers."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime

from ...hostlist import expand_hostlist
from ...topology import Topology, parse_slurm_topology
from ..commands import NoJobId, Runner, SchedulerCommands, SchedulerError, run_local
from ..pilot import QueueJob

# scancel's exit status for jobs that are gone or going: 1 for an id Slurm no longer knows, or Slurm's own error
# number mod 256 (seen: 229, ESLURM_ALREADY_DONE 2021 "Job/step already completing or completed", for a pilot
# released twice while it ended; ESLURM_INVALID_JOB_ID 2017 alike)
SCANCEL_GONE = (0, 1, 2017 % 256, 2021 % 256)


class SlurmError(SchedulerError):
    """A Slurm command that failed (sinfo, squeue, sbatch, scancel, ...)."""


@dataclass(frozen=True)
class NodeRecord:
    """One node of a partition, as sinfo lists it."""

    name: str
    state: str                      # sinfo's compact state: idle, alloc, mix, plnd, drain, down, ...

    @property
    def usable(self) -> bool:
        """Idle now: 'plnd' nodes are idle too, only planned for a pending job later (that is the hole)."""
        return self.state.rstrip("*~#!%$@^-") in ("idle", "plnd") and not self.state.endswith("*")


@dataclass(frozen=True)
class JobRecord:
    """A finished job, as sacct lists it."""

    job_id: str
    state: str                      # COMPLETED, CANCELLED, TIMEOUT, ... (sacct)
    reason: str = ""


@dataclass(frozen=True)
class ReservationRecord:
    """An advance reservation: its nodes are taken from its start."""

    name: str
    start: float | None
    end: float | None
    nodes: tuple[str, ...]


def parse_time(text: str) -> float | None:
    """Slurm's ISO local time ('2026-11-21T18:19:55') or epoch seconds (SLURM_TIME_FORMAT=%s); N/A, Unknown or
    empty -> None."""
    text = text.strip()
    if not text or text in ("N/A", "Unknown", "None", "(null)"):
        return None
    if text.isdigit():
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_sinfo_nodes(text: str) -> list[NodeRecord]:
    """``sinfo -h -N -p P -o %N|%t`` (one row per node and partition; duplicates are dropped)."""
    out, seen = [], set()
    for line in text.splitlines():
        if "|" not in line:
            continue
        name, state = (x.strip() for x in line.split("|", 1))
        if name not in seen:
            seen.add(name)
            out.append(NodeRecord(name, state))
    return out


def parse_squeue(text: str) -> list[QueueJob]:
    """``squeue -h -t all -o %i|%T|%S|%e|%Y|%N|%r|%D|%l``: every job slurmctld holds (finished ones for
    MinJobAge). Waiting jobs: %S/%Y = backfill's planned start and nodes; running: %S/%e = start and time-limit
    end, %N = where. %D/%l (nodes asked for, time limit) may be missing (older recordings)."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split("|")]
        if len(parts) < 7 or not parts[0]:
            continue
        jid, state, start, end, sched, nodes, reason = parts[:7]
        size, limit = [*parts[7:9], "", ""][:2]
        waiting = state == "PENDING"
        out.append(QueueJob(jid, state, reason, parse_time(start), None if waiting else parse_time(end),
                            expand_hostlist(sched if waiting else nodes), int(size) if size.isdigit() else 0,
                            parse_time_limit(limit)))
    return out


def parse_time_limit(text: str) -> float | None:
    """A Slurm time limit in seconds ('minutes', 'minutes:seconds', 'hours:minutes:seconds',
    'days-hours[:minutes[:seconds]]'); UNLIMITED, NOT_SET, INVALID or empty -> None."""
    days, _, clock = text.strip().rpartition("-")
    try:
        parts = [int(x) for x in clock.split(":")]
        d = int(days) if days else 0
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3:
        return None
    if days:                                    # days-hours[:minutes[:seconds]]
        h, m, sec = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        h, m, sec = parts
    else:                                       # minutes[:seconds]
        h, (m, sec) = 0, [*parts, 0][:2]
    return float(((d * 24 + h) * 60 + m) * 60 + sec)


def parse_sacct(text: str) -> list[JobRecord]:
    """``sacct -X -P -n -j IDS -o JobID,State``: 'JobID|State' lines (allocations only: -X)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            out.append(JobRecord(parts[0], parts[1].split()[0], ""))
    return out


def parse_reservations(text: str) -> list[ReservationRecord]:
    """``scontrol show reservation -o``: one 'ReservationName=... StartTime=... Nodes=...' line each."""
    out = []
    for line in text.splitlines():
        f = dict(re.findall(r"(\w+)=(\S*)", line))
        if "ReservationName" in f:
            out.append(ReservationRecord(f["ReservationName"], parse_time(f.get("StartTime", "")),
                                         parse_time(f.get("EndTime", "")), expand_hostlist(f.get("Nodes", ""))))
    return out


def parse_job_limit(text: str) -> int | None:
    """``sacctmgr -n -P show assoc user=U format=MaxJobs,MaxSubmitJobs``: the smallest cap set, or None."""
    caps = [int(x) for line in text.splitlines() for x in line.split("|") if x.strip().isdigit()]
    return min(caps) if caps else None


_SUBMITTED = re.compile(r"Submitted batch job (\d+)")
_TEST_ONLY = re.compile(r"Job \S+ to start at (\S+) using (\d+) processors on nodes (\S+)")


def parse_sbatch(text: str) -> str:
    """The job id sbatch printed; NoJobId (a ValueError) when it printed none."""
    m = _SUBMITTED.search(text)
    if not m:
        raise NoJobId("sbatch", text)
    return m.group(1)


def parse_test_only(text: str) -> tuple[float | None, str]:
    """``sbatch --test-only`` (on stderr): (planned start, nodes)."""
    m = _TEST_ONLY.search(text)
    return (parse_time(m.group(1)), m.group(3)) if m else (None, "")


def _run_slurm(argv: list[str]) -> tuple[int, str, str]:
    # epoch seconds: no guessing which time zone slurmctld prints local times in
    return run_local(argv, env={**os.environ, "SLURM_TIME_FORMAT": "%s"})


class SlurmCommands(SchedulerCommands):
    """The one seam between parsl-bft and Slurm."""

    error = SlurmError

    def __init__(self, runner: Runner = _run_slurm):
        super().__init__(runner)

    def nodes(self, partition: str) -> list[NodeRecord]:
        """The partition's nodes and their states (sinfo)."""
        return parse_sinfo_nodes(self._run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%t"])[0])

    def queue(self) -> list[QueueJob]:
        """The whole queue in one query: waiting jobs' plans and our pilots' states alike."""
        return parse_squeue(self._run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%S|%e|%Y|%N|%r|%D|%l"])[0])

    def topology(self) -> Topology | None:
        """The tree's leaf switches (``scontrol show topology``); None where Slurm has no topology plugin."""
        out = self._run(["scontrol", "show", "topology"])[0]
        return parse_slurm_topology(out, source="scontrol show topology") if "SwitchName=" in out else None

    def reservations(self) -> list[ReservationRecord]:
        """Every advance reservation (scontrol show reservation)."""
        return parse_reservations(self._run(["scontrol", "show", "reservation", "-o"])[0])

    def finished(self, job_ids: list[str]) -> list[JobRecord]:
        """Jobs that left squeue, from the accounting database, or from the job-completion log where a site
        has no slurmdbd (``sacct -c``). A failing sacct says nothing: those jobs stay unknown."""
        if not job_ids:
            return []
        argv = ["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids), "-o", "JobID,State"]
        rc, out, _ = self.runner(argv)
        if rc == 0 and "accounting storage is disabled" in out:     # no slurmdbd: the completion log
            rc, out, _ = self.runner([*argv[:1], "-c", *argv[1:]])
        return parse_sacct(out) if rc == 0 else []

    def submit(self, script_path: str) -> str:
        """sbatch a script; its job id."""
        out, err = self._run(["sbatch", script_path])
        return parse_sbatch(out + err)

    def test_only(self, args: list[str]) -> tuple[float | None, str]:
        """When and where a job of ``args`` would start now (sbatch --test-only); (None, "") when Slurm does not say."""
        _, out, err = self.runner(["sbatch", "--test-only", *args, "--wrap", "true"])
        return parse_test_only(out + err)

    def try_job(self, args: list[str]) -> tuple[int, str]:
        """``sbatch --test-only`` of a job of ``args``: (exit status, what sbatch said). Nothing is submitted; a
        non-zero status is the scheduler refusing the job (invalid partition, account, QOS, an unsatisfiable
        request), in its own words."""
        rc, out, err = self.runner(["sbatch", "--test-only", *args, "--wrap", "true"])
        return rc, " ".join((err + " " + out).split())

    def grace_time(self, partition: str) -> int | None:
        """The partition's GraceTime in seconds (``scontrol show partition -o``): how long a preempted job has
        between SIGTERM and SIGKILL; None where scontrol does not say."""
        rc, out, _ = self.runner(["scontrol", "show", "partition", "-o", partition])
        m = re.search(r"\bGraceTime=(\d+)", out) if rc == 0 else None
        return int(m.group(1)) if m else None

    def private_data(self) -> set[str]:
        """What Slurm hides from other users (``scontrol show config``: PrivateData), e.g. {"jobs"}; empty where
        nothing is hidden or scontrol does not say."""
        rc, out, _ = self.runner(["scontrol", "show", "config"])
        m = re.search(r"^PrivateData\s*=\s*(\S+)", out, re.M) if rc == 0 else None
        return set() if m is None else {w.lower() for w in m.group(1).split(",")} - {"none"}

    def release(self, job_ids: list[str]) -> None:
        """Ask running pilots to end themselves: USR2 to their batch scripts (``scancel --batch --signal``), whose
        trap stops the worker and exits 0 (ids Slurm no longer knows, or jobs already ending, are no error)."""
        if job_ids:
            self._run(["scancel", "--batch", "--signal=USR2", *job_ids], ok_codes=SCANCEL_GONE)

    def cancel(self, job_ids: list[str]) -> None:
        """scancel these jobs (ids Slurm no longer knows, or jobs already ending, are no error)."""
        if job_ids:
            self._run(["scancel", *job_ids], ok_codes=SCANCEL_GONE)

    def job_limit(self, user: str) -> int | None:
        """The user's cap on jobs in the queue (the smaller of MaxJobs and MaxSubmitJobs of their associations);
        None where there is no cap or no slurmdbd to ask."""
        rc, out, _ = self.runner(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}",
                                  "format=MaxJobs,MaxSubmitJobs"])
        return parse_job_limit(out) if rc == 0 else None
