"""An orchestrator's state directory: its lock, its paths, and the one documented tree of what lives in it.

::

    <state_dir>/                      0700, one orchestrator at a time (flock on orchestrator.lock)
      orchestrator.lock               who holds it: "pid P on HOST, since T"
      state.sqlite                    jobs, the event log, measured curves, where each job last ran (JobStore)
      run-id                          this run's name outside the state directory: <workflow>-<12 hex digits>
      run-id.home                     the directory the run id was made for (a copy of it is refused)
      jobs/<job>/                     a job's checkpoints and protocol files at the single (or default) site,
                                      unless the site file names a checkpoint_dir: then
                                      <checkpoint_dir>/<run-id>/<job>/ (0700; another run never sees them)
        ckpt-<step>.h5, damaged/      checkpoints (train.checkpoint, format 3) and the ones set aside as damaged
                                      (one a newer parsl-bft wrote stays in place: the job fails naming its format)
        GENERATION, FRAGMENT, STOP    the fence and the stop request (train.protocol.JobDir)
        progress.json, logs/          live progress, rank output (the newest 32 logs kept)
        metrics.csv                   one row per step: loss, ranks, ctx.report() and evaluate() (train.metrics)
        .errors/<fragment>/           a failed rank's exception and traceback
        .ranks-<host>-<frag>-<pid>.pid  rank pids with their start times (a restart kills its predecessor's)
      sites/<site>/jobs/<job>/        the same, per site, when several sites run (a job that moves is staged)
      .warm-up/<generation>-<site>/   the rank forkservers' start barrier
      runinfo/<run>/submit_scripts/   Parsl's run directory: pilot scripts and the pilot ledger (pilots-<executor>)

Checkpoint paths in the database are relative to the state directory when they lie under it, so a moved state
directory still points at its own files.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import shlex
import socket
import stat
import time
from pathlib import Path
from typing import IO

from .errors import StateError, StateLocked

DATABASE = "state.sqlite"
LOCK = "orchestrator.lock"
RUN_ID = "run-id"
RUN_HOME = "run-id.home"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}\Z")


def check_private(d: Path, what: str = "state directory") -> None:
    """A state directory (or a checkpoint directory, a remote run's folder: ``what``) must be the user's own, a
    real directory, and writable by nobody else: on a shared login node or project folder, another user could
    otherwise prepare one whose lock file is a link to the victim's files, or whose database holds jobs (and
    training code) they chose. Refused, naming the path and the fix."""
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{what} {d} is a symbolic link: give the real path (a link may point into "
                         "someone else's files)")
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{what} {d} is not a directory: give a directory of your own")
    if st.st_uid != os.getuid():
        raise StateError(f"{what} {d} belongs to another user (uid {st.st_uid}): use a directory of "
                         "your own")
    if st.st_mode & 0o022:
        raise StateError(f"{what} {d} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"chmod 700 {d}, after checking nobody else has put files in it")


def private_dir(d: Path, what: str) -> Path:
    """``d`` made (0700, with its missing parents) if missing, then checked (``check_private``)."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:        # a file of that name, a parent that is a file, no permission
        raise StateError(f"{what} {d}: cannot use it as a directory: {e.strerror}") from None
    check_private(d, what)
    return d


def check_plain_path(d: Path, what: str = "state directory") -> None:
    """A state directory's path reaches shell command lines that Parsl builds without quoting (the worker pool's
    ``--logdir``, pilot scripts under ``runinfo/``): a space there split the command (the run stalled for
    ever), a ``$(...)`` was executed. Refused at start, naming the characters, unless the path needs no quoting."""
    full = str(d.resolve())
    if shlex.quote(full) != full:
        bad = "".join(sorted({c for c in full if shlex.quote(c) != c}))
        raise StateError(f"{what} {full!r}: its path holds {bad!r}, which Parsl's worker and pilot "
                         "commands would pass to a shell unquoted; use a path of letters, digits and . _ - / "
                         "+ @ % = : , only")


_CANNOT = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "your disk quota is full",
           errno.EROFS: "it is on a read-only file system", errno.EACCES: "you may not write there",
           errno.EPERM: "you may not write there", errno.ENAMETOOLONG: "its path is too long"}


def unusable(d: Path, e: OSError) -> StateError:
    """A state directory that cannot be made, written or locked (read-only, full, a path too long): one line
    naming it and why, instead of a traceback (nothing of the run is lost: it had not started)."""
    why = _CANNOT.get(e.errno or 0, e.strerror or str(e))
    where = f" ({e.filename})" if e.filename and str(e.filename) != str(d) else ""
    return StateError(f"state directory {d}: cannot use it: {why}{where}; give one you can write, with room")


def lock_state_dir(d: Path) -> IO[str]:
    """An exclusive lock on a state directory for as long as the returned file stays open (the process may die:
    the kernel releases it). A second orchestrator on the same directory is refused, not run beside the first.
    The directory must be private (``check_private``); the lock file is never a link followed."""
    check_private(d)
    try:
        fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise StateError(f"{d / LOCK} is a symbolic link: remove it (it may point into someone else's files)") from None
    f = os.fdopen(fd, "r+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = f.read().strip() or "unknown"
        f.close()
        raise StateLocked(f"state directory {d} is in use by another orchestrator ({holder}); stop it first, or give "
                          "this one another state directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f


def holder_gone(d: Path) -> int | None:
    """The pid of the orchestrator the state directory's lock names when that process is gone (it ended without
    recording why: a second Ctrl-C, kill -9, a crash); None while it may be alive, on another host (no way to
    tell from here), or when nothing is named. Read-only: no lock is taken (that could refuse a starting one)."""
    try:
        fd = os.open(d / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        m = re.match(r"pid (\d+) on (\S+),", f.read(300))
    if m is None or m[2] != socket.gethostname():
        return None
    pid = int(m[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except PermissionError:         # alive, another user's (a pid reused)
        return None
    return None


def read_run_id(path: Path, stem: str) -> str:
    """The run id kept in ``path``, made (``<stem>-<12 hex digits>``) if there is none yet; never through a link."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            new = f"{re.sub(r'[^A-Za-z0-9._-]', '_', stem).lstrip('._-')[:40] or 'run'}-{secrets.token_hex(6)}"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(new + "\n")
            return new
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise StateError(f"{path} is a symbolic link: remove it (it may point into someone else's files)") from None
        with os.fdopen(fd) as f:
            text = f.read(200).strip()
        if not _RUN_ID.match(text):
            raise StateError(f"{path} holds no run id ({text[:40]!r}): remove it if this state directory never ran "
                             "with a site's checkpoint_dir (a new one is made), else restore it")
        return text


def check_not_a_copy(root: Path, run_id: str) -> None:
    """A copied state directory keeps the run id, which names the original's folder in a site's checkpoint_dir:
    the copy's orchestrator would fence and kill the original's fragments there (they failed as stale). The
    directory the id was made for is kept in ``run-id.home``; a directory whose record names another directory
    that still exists and still holds this run id is a copy, refused before anything there is touched. A moved
    directory (nothing left at the recorded path) takes the record over."""
    home = root / RUN_HOME
    here = str(root.resolve())
    try:
        fd = os.open(home, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        recorded = None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise StateError(f"{home} is a symbolic link: remove it (it may point into someone else's files)") from None
    else:
        with os.fdopen(fd) as f:
            recorded = f.read(8192).strip()
    if recorded == here:
        return
    if recorded and _holds_run_id(Path(recorded), run_id) and not _same_dir(Path(recorded), root):
        raise StateError(f"state directory {root} is a copy of {recorded}: its run id ({run_id}) names that "
                         "directory's checkpoints in the site's checkpoint_dir. Start the copy afresh "
                         "(parsl-bft run --new-run), or remove it")
    tmp = root / f".{RUN_HOME}.{secrets.token_hex(4)}"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(here + "\n")
    os.replace(tmp, home)


def _holds_run_id(d: Path, run_id: str) -> bool:
    try:
        fd = os.open(d / RUN_ID, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd) as f:
        return f.read(200).strip() == run_id


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class StateDir:
    """The paths of one state directory (see the module's tree); ``create`` makes it (0700) if missing."""

    def __init__(self, root: str | Path, *, create: bool = True):
        self.root = Path(root)
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._run_id: str | None = None
        self._outside: dict[Path, Path] = {}     # checkpoint_dir -> this run's folder there, checked

    @property
    def database(self) -> Path:
        """The SQLite file of jobs, events and measured values."""
        return self.root / DATABASE

    def lock(self) -> IO[str]:
        """Take the state directory (``lock_state_dir``)."""
        return lock_state_dir(self.root)

    def run_id(self) -> str:
        """This run's name for what it keeps outside the state directory (under a site's checkpoint_dir): made
        at its first use and kept here, so a restart finds its own job directories, while a new run
        (``--new-run`` sets the old state aside) or another workflow's state directory gets folders of its own."""
        if self._run_id is None:
            run_id = read_run_id(self.root / RUN_ID, self.root.resolve().name)
            check_not_a_copy(self.root, run_id)
            self._run_id = run_id
        return self._run_id

    def jobs_root(self, site: str, checkpoint_dir: Path | None) -> Path:
        """Where a site's job directories live: this run's folder in the site's checkpoint_dir when it names one
        (both the user's own and writable by nobody else, ``check_private``; made 0700 if missing), else here."""
        if checkpoint_dir is None:
            return self.root / "jobs" if not site else self.root / "sites" / site / "jobs"
        top = Path(checkpoint_dir)
        if top not in self._outside:
            private_dir(top, "checkpoint directory")
            self._outside[top] = private_dir(top / self.run_id(), "checkpoint directory")
        return self._outside[top]

    def warm_up_dir(self, generation: str, site: str) -> Path:
        """The start barrier of one site's rank forkservers in one orchestrator generation."""
        return self.root / ".warm-up" / f"{generation}-{site or 'local'}"

    def rel(self, path: str | None) -> str | None:
        """A checkpoint path as stored: relative to the state directory when it lies under it."""
        if not path:
            return path
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(Path(path).resolve())

    def abs(self, path: str | None) -> str | None:
        """A stored checkpoint path as a usable one."""
        return str(self.root / path) if path and not os.path.isabs(path) else path
