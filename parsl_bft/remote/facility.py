"""What runs AT THE FACILITY, inside Globus Compute tasks on the endpoint: short calls on a run's folder.

Each function is sent by reference (the endpoint's Python has parsl-bft installed) and returns quickly: the
training itself runs in a detached process (``parsl_bft.remote.runner``), never inside a Globus Compute task.

A run's folder ``<runs_dir>/<run_id>/`` is the user's own, 0700, and used only while it stays so (another user of a
shared runs_dir cannot prepare one); nothing in it is written through a symbolic link:

    request.json   what was submitted (workflow, arguments, facility site file, content digest)
    work/          the shipped workflow and model files; the session's working directory (its state dirs)
    session.lock   held (flock) by the live session: the one test of "running" that survives pid reuse
    session.log    the session's stdout and stderr, appended across resumes
    runner.json    pid and host of the live session; exit.json: how the last one ended; cancel: a cancel asked
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from ..errors import ParslBftError
from ..execution.statedir import DATABASE, check_private, private_dir
from ..safe_python import python_command


class RunState(StrEnum):
    """Where a remote run's session stands (``run_status``); its jobs' own are ``JobStatus``."""

    STARTING = "starting"          # alive, and no job has launched a fragment yet (workers warming up, or no nodes)
    RUNNING = "running"
    CANCELLING = "cancelling"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"                  # ended without a word (e.g. the login node rebooted)


END_STATES = (RunState.FINISHED, RunState.FAILED, RunState.CANCELLED, RunState.LOST)   # the session is over
CHUNK = 4 << 20                  # checkpoint bytes per call: base64-encoded still well under the 10 MB task limit
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")


class FacilityError(ParslBftError):
    """A request the facility side refuses; the message reaches the laptop as is."""


def check_run_id(run_id: str) -> str:
    """A run id names a folder: one path component, so no id reaches outside ``runs_dir``."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise FacilityError(f"run id {run_id!r}: use 1-100 letters, digits, '.', '_' or '-', starting with a "
                            "letter or digit")
    return run_id


def run_dir(runs_dir: str, run_id: str) -> Path:
    """The folder of run ``run_id`` under ``runs_dir`` (the id checked first)."""
    return Path(os.path.expanduser(runs_dir)) / check_run_id(run_id)


def _safe_relative(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or not p.parts or ".." in p.parts:
        raise FacilityError(f"shipped file {name!r}: must be a relative path inside the workflow's folder")
    return p


def open_in(d: Path, name: str, flags: int, dir_fd: int | None = None) -> int:
    """``os.open`` of ``name`` in the run's folder ``d`` (or in the folder open as ``dir_fd``), never through a
    symbolic link: one there is refused, naming it."""
    try:
        return os.open(name if dir_fd is not None else d / name, flags | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise FacilityError(f"{d / name} is a symbolic link or not what the run left there: remove it (a link may "
                            "point into someone else's files)") from None


def write_in(d: Path, name: str, text: str) -> None:
    """Replace the file ``name`` of the run's folder ``d`` with ``text`` (``open_in``: no link followed)."""
    with os.fdopen(open_in(d, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(text)


def _write_work(d: Path, rel: PurePosixPath, data: bytes) -> None:
    """A shipped file into ``d``/work, folder by folder through open descriptors (O_NOFOLLOW): a link prepared
    anywhere on the way is refused, never followed out of the run's folder."""
    fd = open_in(d, ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        where = d
        for part in ("work", *rel.parts[:-1]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            sub = open_in(where, part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, where = sub, where / part
        with os.fdopen(open_in(where, rel.parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, dir_fd=fd), "wb") as f:
            f.write(data)
    finally:
        os.close(fd)


def _alive(d: Path) -> bool:
    """Whether a session holds the run's lock (a dead one's lock is released by the kernel)."""
    try:
        fd = os.open(d / "session.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _ended_well(d: Path) -> bool:
    """Whether the last session finished; only meaningful once ``_alive(d)`` said no (exit.json is written
    before the lock is let go, so reading it first could miss a session that ends in between)."""
    ended = _read_json(d / "exit.json")
    return ended is not None and ended["code"] == 0


def start_run(runs_dir: str, run_id: str, files: dict[str, bytes], request: dict) -> dict:
    """Write the run's files (first time) and start its session detached, unless one runs or the run finished:
    the same run id submitted again never starts a second session; after a cancel or a failure it resumes
    (same state directories, so every job continues from its newest checkpoint)."""
    d = private_dir(run_dir(runs_dir, run_id), "run folder")
    with os.fdopen(open_in(d, "submit.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)       # two submits of one run id at once: one starts it
        old = _read_json(d / "request.json")
        if old is not None and old.get("digest") != request.get("digest"):
            raise FacilityError(f"run id {run_id} already names a different submission (other files or "
                                "arguments): choose another run id")
        if old is None:
            paths = {_safe_relative(name): data for name, data in files.items()}
            if _safe_relative(request["workflow"]) not in paths:
                raise FacilityError(f"the workflow {request['workflow']!r} is not among the shipped files")
            for rel, data in paths.items():
                _write_work(d, rel, data)
            write_in(d, "request.json", json.dumps(request))   # last: the run exists once it is complete
        if _alive(d) or _ended_well(d):
            return {**run_status(runs_dir, run_id), "started": False}
        for stale in ("exit.json", "cancel", "runner.json"):
            (d / stale).unlink(missing_ok=True)
        _spawn(d)
    return {**run_status(runs_dir, run_id), "started": True}


def _spawn(d: Path) -> None:
    """Start the runner holding the run's lock from the first instant: the lock is taken here and the runner
    inherits it, so no second submit can slip in before the session has started."""
    fd = open_in(d, "session.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with os.fdopen(open_in(d, "session.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as log:
            # the runner forks and this child exits at once: the session is nobody's child here, so it
            # outlives the endpoint worker and leaves no zombie behind in it
            try:
                code = subprocess.run(python_command("-m", "parsl_bft.remote.runner", str(d), str(fd)),
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      pass_fds=(fd,), start_new_session=True, timeout=120).returncode
            except subprocess.TimeoutExpired:
                raise FacilityError(f"the session runner did not detach within 120 s (a hung file system under "
                                    f"{d}?); see {d / 'session.log'}") from None
    finally:
        os.close(fd)
    if code != 0:
        tail = run_logs(str(d.parent), d.name, tail=2000)["text"].strip()
        raise FacilityError(f"the session did not start ({sys.executable} exited {code}): {tail}")


def _state_dirs(work: Path) -> list[Path]:
    """Every orchestrator state directory the workflow opened under its working directory."""
    found = []
    for root, dirs, names in os.walk(work):
        if DATABASE in names:
            found.append(Path(root))
            dirs[:] = []                # its jobs/ and runinfo/ hold no further state directory
        dirs.sort()
    return found


def _jobs(d: Path) -> list[dict]:
    from ..execution.jobstore import JobStatus, JobStore
    from ..execution.report import read_jobs

    rows = []
    work = d / "work"
    for sd in _state_dirs(work):
        db = JobStore(sd / DATABASE, readonly=True)
        try:
            for j in read_jobs(db, sd):
                r = j.row
                rows.append({"state": str(sd.relative_to(work)), "job": j.name, "status": r.status.value,
                             "samples_done": j.samples_now if r.status is JobStatus.RUNNING else r.samples_done,
                             "samples": r.spec.get("samples"), "nodes": r.size, "fragments": r.fragments,
                             "checkpoint": j.checkpoint})
        finally:
            db.close()
    return rows


def _submitted(runs_dir: str, run_id: str) -> Path:
    d = run_dir(runs_dir, run_id)
    if not d.is_dir() or not (d / "request.json").exists():
        raise FacilityError(f"no run {run_id} under {runs_dir} at the facility")
    check_private(d, "run folder")       # another user's folder is none of this run's: nothing read, signalled
    return d


def run_status(runs_dir: str, run_id: str) -> dict:
    """The run's state (starting, running, finished, failed, cancelled, lost: ended without a word, e.g. the
    login node rebooted) and its jobs' progress, read from the run's folder."""
    from ..execution.jobstore import JobStatus

    d = _submitted(runs_dir, run_id)
    alive = _alive(d)
    ended = _read_json(d / "exit.json")     # after the lock test: a session writes it before it lets go
    jobs = _jobs(d)
    if alive:
        state = (RunState.CANCELLING if (d / "cancel").exists()
                 else RunState.RUNNING if any(j["fragments"] or j["status"] != JobStatus.WAITING for j in jobs)
                 else RunState.STARTING)
    elif ended is not None and ended["code"] == 0:
        state = RunState.FINISHED               # also when a cancel came too late
    elif (d / "cancel").exists():
        state = RunState.CANCELLED
    else:
        state = RunState.LOST if ended is None else RunState.FAILED
    return {"run_id": run_id, "state": state.value, "exit_code": ended and ended["code"], "folder": str(d),
            "host": socket.gethostname(), "runner": _read_json(d / "runner.json"), "jobs": jobs}


def run_logs(runs_dir: str, run_id: str, offset: int | None = None, tail: int = 64 << 10) -> dict:
    """The session's log from ``offset`` (at most CHUNK bytes), or its last ``tail`` bytes."""
    p = _submitted(runs_dir, run_id) / "session.log"
    size = p.stat().st_size if p.exists() else 0
    start = max(0, size - tail) if offset is None else min(max(0, offset), size)
    data = b""
    if size > start:
        with open(p, "rb") as f:
            f.seek(start)
            data = f.read(min(CHUNK, size - start))
    return {"text": data.decode("utf-8", "replace"), "offset": start + len(data), "size": size}


def cancel_run(runs_dir: str, run_id: str) -> dict:
    """Ask the session to stop: SIGTERM, which a training session turns into checkpoint-and-release."""
    d = _submitted(runs_dir, run_id)
    if _alive(d):
        # the mark before runner.json is read: runner.main writes runner.json, then looks for the mark
        write_in(d, "cancel", time.strftime("%Y-%m-%d %H:%M:%S"))
        runner = _read_json(d / "runner.json")
        if runner and runner.get("host") != socket.gethostname():
            # runs_dir on a file system several login nodes share: that pid means another process here
            (d / "cancel").unlink(missing_ok=True)
            raise FacilityError(f"run {run_id}'s session runs on {runner.get('host')}, this endpoint on "
                                f"{socket.gethostname()}: cancel it through an endpoint there")
        if runner:                              # else it has not started yet, and stops when it sees the mark
            os.kill(runner["pid"], signal.SIGTERM)
    return run_status(runs_dir, run_id)


def _checkpoint(runs_dir: str, run_id: str, state: str, job: str) -> Path:
    """Only a checkpoint a job of this run recorded can be read: these calls are no general file reader."""
    for row in _jobs(run_dir(runs_dir, run_id)):
        if row["state"] == state and row["job"] == job and row["checkpoint"]:
            return Path(row["checkpoint"])
    raise FacilityError(f"run {run_id}: no checkpoint of job {job!r} in state directory {state!r}")


_CKPT_NAME = re.compile(r"ckpt-\d+\.h5\Z")       # train.checkpoint.store's names; not imported: that loads torch
_HDF5 = b"\x89HDF\r\n\x1a\n"          # an HDF5 superblock's first bytes: at 0, or after a user block of 512 * 2**k
#                                      bytes (checkpoint format 3 keeps its record there)


def _is_hdf5(f: BinaryIO) -> bool:
    """Where HDF5 itself looks for the superblock: offset 0, then 512, 1024, 2048, ... bytes."""
    size, at = os.fstat(f.fileno()).st_size, 0
    while at + len(_HDF5) <= size:
        f.seek(at)
        if f.read(len(_HDF5)) == _HDF5:
            return True
        at = 512 if at == 0 else 2 * at
    return False


def _open_checkpoint(runs_dir: str, run_id: str, state: str, job: str) -> tuple[Path, BinaryIO]:
    """A job's recorded checkpoint, open, if it is one: ``ckpt-<step>.h5`` in a folder named after the job, a
    regular HDF5 file reached through no link. The path comes from the run's database, which the workflow's own
    code can write: without these checks a fetch copied any file the endpoint's user can read."""
    p = _checkpoint(runs_dir, run_id, state, job)
    refused = f"run {run_id}: job {job!r}'s recorded checkpoint {p}"
    if not _CKPT_NAME.match(p.name) or p.parent.name != job:
        raise FacilityError(f"{refused} is not ckpt-<step>.h5 in the job's folder: not sent")
    try:
        f = os.fdopen(os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
    except OSError as e:
        raise FacilityError(f"{refused} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or not _is_hdf5(f):
        f.close()
        raise FacilityError(f"{refused} is not an HDF5 file: not sent")
    f.seek(0)
    return p, f


def checkpoint_digest(runs_dir: str, run_id: str, state: str, job: str) -> dict[str, Any]:
    """Path, size and SHA-256 of a job's final checkpoint: what a fetch checks its copy against."""
    h = hashlib.sha256()
    p, f = _open_checkpoint(runs_dir, run_id, state, job)
    with f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        return {"path": str(p), "size": f.tell(), "sha256": h.hexdigest()}


def checkpoint_chunk(runs_dir: str, run_id: str, state: str, job: str, offset: int) -> bytes:
    """CHUNK bytes of a job's final checkpoint from ``offset`` (a fetch copies it chunk by chunk)."""
    with _open_checkpoint(runs_dir, run_id, state, job)[1] as f:
        f.seek(offset)
        return f.read(CHUNK)


_OPS: dict[str, Callable[..., Any]] = {"start": start_run, "status": run_status, "logs": run_logs,
                                       "cancel": cancel_run, "digest": checkpoint_digest, "chunk": checkpoint_chunk}


def call(op: str, *args: Any) -> dict[str, Any]:
    """The one function the laptop sends: ``{"ok": result}``, or ``{"error": message}`` for a refusal - a
    message, not an exception, because the SDK turns a task's exception into its traceback text."""
    try:
        return {"ok": _OPS[op](*args)}
    except ParslBftError as e:          # a damaged state database too: its advice reaches the user
        return {"error": str(e)}

