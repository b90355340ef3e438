"""What the laptop accepts from the endpoint: every answer of a facility call checked for its types and shape
before anything reads it, so a broken or hostile endpoint gives one line naming the odd value (never a traceback
on ``None`` or a string), and no name it sends reaches outside the folder a fetch writes to."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from ..errors import ParslBftError
from ..execution.jobstore import STORED
from ..jobs import check_job_name
from .facility import CHUNK, RunState

RUN_STATES = tuple(RunState)
JOB_STATUSES = STORED        # what a job row holds: the facility sends its rows' status
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


class BadAnswer(ParslBftError):
    """An answer of the endpoint that is not what the facility side sends."""


def _show(value: object) -> str:
    return repr(value)[:60]


def _bad(op: str, what: str, value: object, expected: str) -> BadAnswer:
    return BadAnswer(f"the endpoint's answer to {op}: {what} is {_show(value)}, not {expected} (is the facility's "
                     "parsl-bft the same version as this one?)")


def _field(op: str, d: dict[str, Any], key: str, kind: type | tuple[type, ...], expected: str,
           optional: bool = False) -> Any:
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        raise _bad(op, key, v, expected)
    return v


def _count(op: str, d: dict[str, Any], key: str, optional: bool = False) -> int | None:
    v = _field(op, d, key, int, "a count", optional)
    if v is not None and v < 0:
        raise _bad(op, key, v, "a count")
    return v


def _dict(op: str, value: object, what: str = "the answer") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(op, what, value, "a mapping")
    return value


def state_path(value: object, op: str = "status") -> str:
    """A state directory as the facility names it: a relative path of job-name-like parts (it names files here)."""
    parts = PurePosixPath(value).parts if isinstance(value, str) else ()
    try:
        if not parts or any(check_job_name(p) != p for p in parts):
            raise ValueError
    except ValueError:
        raise _bad(op, "a state directory", value, "a relative path of plain names") from None
    return str(value)


def job_row(value: object, op: str = "status") -> dict[str, Any]:
    """One job of a run's status."""
    r = _dict(op, value, "a job row")
    state_path(r.get("state"), op)
    try:
        check_job_name(r.get("job"))
    except ValueError:
        raise _bad(op, "a job's name", r.get("job"), "a plain name") from None
    if r.get("status") not in JOB_STATUSES:
        raise _bad(op, "a job's status", r.get("status"), " or ".join(JOB_STATUSES))
    for key in ("samples_done", "fragments"):
        _count(op, r, key)
    for key in ("samples", "nodes"):
        _count(op, r, key, optional=True)
    _field(op, r, "checkpoint", str, "a path", optional=True)
    return r


def run_status(value: object, op: str = "status") -> dict[str, Any]:
    """A run's status (the answer to status, cancel and start)."""
    st = _dict(op, value)
    _field(op, st, "run_id", str, "a run id")
    if st.get("state") not in RUN_STATES:
        raise _bad(op, "the run's state", st.get("state"), " or ".join(RUN_STATES))
    _field(op, st, "exit_code", int, "an exit code", optional=True)
    for key in ("folder", "host"):
        _field(op, st, key, str, "a string")
    _field(op, st, "runner", dict, "a mapping", optional=True)
    jobs = st.get("jobs")
    if not isinstance(jobs, list):
        raise _bad(op, "jobs", jobs, "a list")
    for r in jobs:
        job_row(r, op)
    return st


def started(value: object) -> dict[str, Any]:
    """The answer to start: a run's status and whether this call started its session."""
    st = run_status(value, "start")
    _field("start", st, "started", bool, "true or false")
    return st


def logs(value: object) -> dict[str, Any]:
    """A piece of the session's log."""
    d = _dict("logs", value)
    _field("logs", d, "text", str, "text")
    _count("logs", d, "offset")
    _count("logs", d, "size")
    return d


def digest(value: object) -> dict[str, Any]:
    """Path, size and SHA-256 of a checkpoint."""
    d = _dict("digest", value)
    _field("digest", d, "path", str, "a path")
    _count("digest", d, "size")
    if not isinstance(d.get("sha256"), str) or not _SHA256.match(d["sha256"]):
        raise _bad("digest", "sha256", d.get("sha256"), "64 hex digits")
    return d


def chunk(value: object) -> bytes:
    """A piece of a checkpoint: bytes, at most one chunk."""
    if not isinstance(value, bytes) or len(value) > CHUNK:
        raise _bad("chunk", "the data", value if not isinstance(value, bytes) else f"{len(value)} bytes",
                   f"at most {CHUNK} bytes")
    return value


CHECKS: dict[str, Callable[[object], Any]] = {"start": started, "status": run_status, "cancel":
                                              lambda v: run_status(v, "cancel"), "logs": logs, "digest": digest,
                                              "chunk": chunk}


def reply(op: str, out: object) -> tuple[bool, Any]:
    """The facility's reply to ``op``: (True, its checked result) or (False, its refusal, one line)."""
    if not isinstance(out, dict) or len(out) != 1 or not ({"ok", "error"} & out.keys()):
        raise _bad(op, "the reply", out, '{"ok": ...} or {"error": ...}')
    if "error" in out:
        if not isinstance(out["error"], str):
            raise _bad(op, "the refusal", out["error"], "a message")
        return False, " ".join(out["error"].split())[:2000]
    return True, CHECKS[op](out["ok"])
