"""Every PBS Pro command parsl-bft runs goes through ``PBSCommands``: argv -> run -> typed records.

PBS Pro prints JSON with ``-F json`` (qstat -f, pbsnodes -a). Queued jobs carry the scheduler's
``estimated.start_time`` when it computes one (strict ordering / backfill): that is when idle nodes are taken back.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...topology import Topology, parse_pbsnodes_topology
from ..commands import NoJobId, SchedulerCommands, SchedulerError


class PBSError(SchedulerError):
    """A PBS command that failed (pbsnodes, qstat, qsub, qdel)."""


@dataclass(frozen=True)
class PBSNode:
    """One vnode, as pbsnodes lists it."""

    name: str
    state: str                  # free, job-busy, job-exclusive, offline, down, resv-exclusive, ...
    ncpus: int
    ngpus: int

    @property
    def usable(self) -> bool:
        """Free now."""
        return self.state == "free"


@dataclass(frozen=True)
class PBSJob:
    """One job, as qstat -f lists it."""

    job_id: str
    state: str                  # Q, R, E, F, H, W, S, X (finished, history)
    queue: str
    nodes: int
    estimated_start: float | None
    exit_status: int | None
    comment: str
    hosts: tuple[str, ...] = ()  # exec_host's hosts, once it runs
    end: float | None = None    # stime + walltime: when PBS takes the nodes back
    planned_nodes: tuple[str, ...] = ()   # queued: estimated.exec_vnode, where the scheduler plans to run it
    walltime: float | None = None  # Resource_List.walltime, in seconds


def _time(v: Any) -> float | None:
    if v in (None, ""):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except ValueError:
        pass
    for fmt in ("%a %b %d %H:%M:%S %Y", "%c"):
        try:
            return datetime.strptime(v, fmt).timestamp()
        except ValueError:
            continue
    return None


def _records(text: str, key: str, command: str) -> dict[str, dict[str, Any]]:
    """The ``key`` object of a ``-F json`` answer, checked to be records by name (PBSError when it is not)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise PBSError(command.split(), 0, f"output is not JSON ({e})") from None
    recs = doc.get(key, {}) if isinstance(doc, dict) else None
    if not isinstance(recs, dict) or not all(isinstance(r, dict) for r in recs.values()):
        raise PBSError(command.split(), 0, f"output's '{key}' is not an object of records by name: {text[:80]!r}")
    return recs


def parse_pbsnodes(text: str) -> list[PBSNode]:
    """``pbsnodes -a -F json``."""
    try:
        return _parse_pbsnodes(_records(text, "nodes", "pbsnodes -a -F json"))
    except (ValueError, TypeError, AttributeError) as e:     # a field of another type than PBS writes
        raise PBSError(["pbsnodes", "-a"], 0, f"unexpected value in its output ({e})") from None


def _parse_pbsnodes(nodes: dict[str, dict[str, Any]]) -> list[PBSNode]:
    out = []
    for name, n in sorted(nodes.items()):
        ra = n.get("resources_available", {})
        out.append(PBSNode(name, str(n.get("state", "unknown")), int(ra.get("ncpus", 0)), int(ra.get("ngpus", 0))))
    return out


def parse_qstat(text: str) -> list[PBSJob]:
    """``qstat -f -F json [-x]``."""
    try:
        return _parse_qstat(_records(text, "Jobs", "qstat -f -F json"))
    except (ValueError, TypeError, AttributeError) as e:     # a field of another type than PBS writes
        raise PBSError(["qstat", "-f"], 0, f"unexpected value in its output ({e})") from None


def _parse_qstat(jobs: dict[str, dict[str, Any]]) -> list[PBSJob]:
    out = []
    for jid, j in jobs.items():
        rl = j.get("Resource_List", {})
        nodes = int(rl.get("nodect", 0) or 0) or _select_nodes(rl.get("select", ""))
        est = (j.get("estimated") or {}).get("start_time")
        vnodes = re.findall(r"\(([^:)]+)", str((j.get("estimated") or {}).get("exec_vnode", "")))
        es = j.get("Exit_status")
        hosts = tuple(dict.fromkeys(h.split("/")[0] for h in str(j.get("exec_host", "")).split("+") if h))
        stime, wall = _time(j.get("stime")), _hms(rl.get("walltime", ""))
        out.append(PBSJob(jid, j.get("job_state", "?"), j.get("queue", ""), nodes, _time(est),
                          int(es) if es is not None else None, j.get("comment", ""), hosts,
                          stime + wall if stime is not None and wall is not None else None, tuple(vnodes), wall))
    return out


def _hms(v: object) -> float | None:
    try:
        parts = [float(x) for x in str(v).split(":")]
    except ValueError:
        return None
    return sum(x * 60 ** i for i, x in enumerate(reversed(parts))) if parts else None


def _select_nodes(select: str) -> int:
    total = 0
    for chunk in select.split("+"):
        m = re.match(r"^(\d+):", chunk)
        total += int(m.group(1)) if m else (1 if chunk else 0)
    return total


def parse_user_caps(text: str) -> list[int]:
    """Per-user job caps in ``qstat -Q -f -F json`` / ``qstat -B -f -F json``: max_queued / max_run limits of the
    form [u:PBS_GENERIC=N] (or [u:USER=N])."""
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    caps = []
    for section in ("Queue", "Server"):
        for attrs in (doc.get(section) or {}).values():
            for key in ("max_queued", "max_run"):
                caps += [int(n) for n in re.findall(r"\[u:[^=\]]+=(\d+)\]", str(attrs.get(key, "")))]
    return caps


def parse_qsub(text: str) -> str:
    """The job id qsub printed; NoJobId (a ValueError) when it printed none."""
    job = text.strip().splitlines()[-1].strip() if text.strip() else ""
    if not re.match(r"^\d+(\.\S+)?$", job):
        raise NoJobId("qsub", text)
    return job


class PBSCommands(SchedulerCommands):
    """The one seam between parsl-bft and PBS Pro."""

    error = PBSError

    def nodes(self) -> list[PBSNode]:
        """Every vnode and its state (pbsnodes -a)."""
        return parse_pbsnodes(self._run(["pbsnodes", "-a", "-F", "json"])[0])

    def topology(self) -> Topology:
        """The vnodes' placement sets (``parse_pbsnodes_topology``: a TopologyError where no resource names a
        group for every node)."""
        return parse_pbsnodes_topology(self._run(["pbsnodes", "-a", "-F", "json"])[0], source="pbsnodes -a")

    def queue(self) -> list[PBSJob]:
        """Every job the server holds, in one query: queued jobs' estimated starts and our pilots' states."""
        return parse_qstat(self._run(["qstat", "-f", "-F", "json"])[0])

    def history(self, job_ids: list[str]) -> list[PBSJob]:
        """Finished jobs too (-x)."""
        if not job_ids:
            return []
        # -x includes finished jobs (history); unknown ids make qstat exit 153 but still print the others
        return parse_qstat(self._run(["qstat", "-x", "-f", "-F", "json", *job_ids], ok_codes=(0, 35, 153))[0] or "{}")

    def submit(self, script_path: str) -> str:
        """qsub a script; its job id."""
        return parse_qsub(self._run(["qsub", script_path])[0])

    def cancel(self, job_ids: list[str]) -> None:
        """qdel these jobs (ids PBS no longer knows, or finished ones, are no error)."""
        if job_ids:
            self._run(["qdel", "-W", "force", *job_ids], ok_codes=(0, 1, 15, 35, 153))

    def queue_info(self, queue: str) -> tuple[int, dict[str, Any], str]:
        """``qstat -Q -f -F json QUEUE``: (exit status, the queue's attributes, what qstat said on error); an
        unknown queue is a non-zero status ("Unknown queue")."""
        rc, out, err = self.runner(["qstat", "-Q", "-f", "-F", "json", queue])
        if rc != 0:
            return rc, {}, " ".join((err or out).split())
        try:
            attrs = (json.loads(out).get("Queue") or {}).get(queue, {})
        except (ValueError, AttributeError):
            attrs = {}
        return rc, attrs if isinstance(attrs, dict) else {}, ""

    def job_limit(self, queue: str) -> int | None:
        """The per-user cap on queued jobs (``max_queued`` / ``max_run`` ``[u:PBS_GENERIC=N]``) of the queue and
        the server, smallest wins; None where none is set or qstat -Q fails."""
        caps = []
        for argv in (["qstat", "-Q", "-f", "-F", "json", queue], ["qstat", "-B", "-f", "-F", "json"]):
            rc, out, _ = self.runner(argv)
            if rc == 0:
                caps += parse_user_caps(out)
        return min(caps) if caps else None
