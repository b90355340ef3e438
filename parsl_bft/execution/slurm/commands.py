"""Every Slurm command parsl-bft runs goes through ``SlurmCommands``: build argv -> run -> parse into typed
records (Balsam's scheduler-interface shape). Tests feed recorded output through the same parsers."""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from ..commands import SchedulerCommands, SchedulerError


class SlurmError(SchedulerError):
    pass


@dataclass(frozen=True)
class NodeRecord:
    name: str
    state: str                      # sinfo's compact state: idle, alloc, mix, plnd, drain, down, ...

    @property
    def usable(self) -> bool:
        """Idle now: 'plnd' nodes are idle too, only planned for a pending job later (that is the hole)."""
        return self.state.rstrip("*~#!%$@^-") in ("idle", "plnd") and not self.state.endswith("*")


@dataclass(frozen=True)
class PendingRecord:
    job_id: str
    planned_start: float | None     # unix time Slurm's backfill plans to start it; None when unknown
    nodes: int
    partition: str
    sched_nodes: tuple[str, ...] = ()   # the nodes backfill plans to start it on (squeue %Y)


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    state: str                      # PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, PREEMPTED, FAILED, ...
    reason: str                     # why it waits; the node list once it runs
    end: float | None = None        # unix time its time limit ends (running jobs)


@dataclass(frozen=True)
class ReservationRecord:
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


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's compressed host lists: 'n[1-3,5],gpu07' -> ('n1', 'n2', 'n3', 'n5', 'gpu07'); text after a bracket
    and several brackets are kept ('n[1-2]-ib' -> ('n1-ib', 'n2-ib'); 'r[1-2]n[01-02]' -> 4 names);
    zero padding follows the lower bound."""
    out: list[str] = []
    for item in _split_outside_brackets(text.strip()):
        out += _expand_one(item)
    return tuple(n for n in out if n and n not in ("(null)", "N/A"))


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail, out = item[:m.start()], item[m.end():], []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        out += [n for i in range(int(lo), int(hi or lo) + 1) for n in _expand_one(f"{head}{i:0{len(lo)}d}{tail}")]
    return out


def parse_squeue_pending(text: str) -> list[PendingRecord]:
    """``squeue -h -t PD -o %i|%S|%D|%P|%Y``."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split("|")]
        if len(parts) < 4:
            continue
        try:
            nodes = int(parts[2])
        except ValueError:
            nodes = 1
        out.append(PendingRecord(parts[0], parse_time(parts[1]), nodes, parts[3],
                                 expand_hostlist(parts[4]) if len(parts) > 4 else ()))
    return out


def parse_squeue_jobs(text: str) -> list[JobRecord]:
    """``squeue -h -j IDS -o %i|%T|%R|%e``."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split("|")]
        if len(parts) >= 2:
            out.append(JobRecord(parts[0], parts[1], parts[2] if len(parts) > 2 else "",
                                 parse_time(parts[3]) if len(parts) > 3 else None))
    return out


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


_SUBMITTED = re.compile(r"Submitted batch job (\d+)")
_TEST_ONLY = re.compile(r"Job \S+ to start at (\S+) using (\d+) processors on nodes (\S+)")


def parse_sbatch(text: str) -> str:
    m = _SUBMITTED.search(text)
    if not m:
        raise ValueError(f"sbatch printed no job id: {text.strip()[:200]!r}")
    return m.group(1)


def parse_test_only(text: str) -> tuple[float | None, str]:
    """``sbatch --test-only`` (on stderr): (planned start, nodes)."""
    m = _TEST_ONLY.search(text)
    return (parse_time(m.group(1)), m.group(3)) if m else (None, "")


class SlurmCommands(SchedulerCommands):
    """The one seam between parsl-bft and Slurm."""

    error = SlurmError

    def nodes(self, partition: str) -> list[NodeRecord]:
        return parse_sinfo_nodes(self._run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%t"])[0])

    def pending(self, partition: str | None = None) -> list[PendingRecord]:
        argv = ["squeue", "-h", "-t", "PD", "-o", "%i|%S|%D|%P|%Y"] + (["-p", partition] if partition else [])
        return parse_squeue_pending(self._run(argv)[0])

    def jobs(self, job_ids: list[str]) -> list[JobRecord]:
        if not job_ids:
            return []
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%R|%e"]
        rc, out, err = self.runner(argv)
        # exit 1 with 'Invalid job id' = none of them is known any more; any other failure (a busy slurmctld
        # timing out) must not read as "every pilot is gone"
        if rc != 0 and not (rc == 1 and "Invalid job id" in err):
            raise self.error(argv, rc, err or out)
        return parse_squeue_jobs(out)

    def reservations(self) -> list[ReservationRecord]:
        return parse_reservations(self._run(["scontrol", "show", "reservation", "-o"])[0])

    def finished(self, job_ids: list[str]) -> list[JobRecord]:
        """Jobs that left squeue, from the accounting database, or from the job-completion log where a site
        has no slurmdbd (``sacct -c``). A failing sacct says nothing: those jobs stay unknown."""
        if not job_ids:
            return []
        argv = ["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids), "-o", "JobID,State"]
        rc, out, _ = self.runner(argv)
        if rc == 0 and "accounting storage is disabled" in out:     # no slurmdbd: the completion log
            rc, out, _ = self.runner(argv[:1] + ["-c"] + argv[1:])
        return parse_sacct(out) if rc == 0 else []

    def submit(self, script_path: str) -> str:
        out, err = self._run(["sbatch", script_path])
        return parse_sbatch(out + err)

    def test_only(self, args: list[str]) -> tuple[float | None, str]:
        rc, out, err = self.runner(["sbatch", "--test-only", *args, "--wrap", "true"])
        return parse_test_only(out + err)

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self._run(["scancel", *job_ids], ok_codes=(0, 1))
