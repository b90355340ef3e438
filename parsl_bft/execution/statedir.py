"""An orchestrator's state directory: its lock, its paths, and the one documented tree of what lives in it.

::

    <state_dir>/                      0700, one orchestrator at a time (flock on orchestrator.lock)
      orchestrator.lock               who holds it: "pid P on HOST, since T"
      state.sqlite                    jobs, the event log, measured curves, where each job last ran (JobStore)
      jobs/<job>/                     a job's checkpoints and protocol files at the single (or default) site,
                                      unless the site file names a checkpoint_dir (then <checkpoint_dir>/<job>/)
        ckpt-<step>.h5, damaged/      checkpoints (train.checkpoint) and the ones set aside as damaged
        GENERATION, FRAGMENT, STOP    the fence and the stop request (train.protocol.JobDir)
        progress.json, logs/          live progress, rank output (the newest 32 logs kept)
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
import socket
import stat
import time
from pathlib import Path
from typing import IO

from .errors import StateError, StateLocked

DATABASE = "state.sqlite"
LOCK = "orchestrator.lock"


def check_private(d: Path) -> None:
    """A state directory must be the user's own, a real directory, and writable by nobody else: on a shared login
    node or project folder, another user could otherwise prepare one whose lock file is a link to the victim's
    files, or whose database holds jobs (and training code) they chose. Refused, naming the path and the fix."""
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"state directory {d} is a symbolic link: give the real path (a link may point into "
                         "someone else's files)")
    if st.st_uid != os.getuid():
        raise StateError(f"state directory {d} belongs to another user (uid {st.st_uid}): use a directory of "
                         "your own")
    if st.st_mode & 0o022:
        raise StateError(f"state directory {d} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"chmod 700 {d}, after checking nobody else has put files in it")


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


class StateDir:
    """The paths of one state directory (see the module's tree); ``create`` makes it (0700) if missing."""

    def __init__(self, root: str | Path, *, create: bool = True):
        self.root = Path(root)
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    @property
    def database(self) -> Path:
        """The SQLite file of jobs, events and measured values."""
        return self.root / DATABASE

    def lock(self) -> IO[str]:
        """Take the state directory (``lock_state_dir``)."""
        return lock_state_dir(self.root)

    def jobs_root(self, site: str, checkpoint_dir: Path | None) -> Path:
        """Where a site's job directories live: its checkpoint_dir when the site names one, else here."""
        if checkpoint_dir is not None:
            return Path(checkpoint_dir)
        return self.root / "jobs" if not site else self.root / "sites" / site / "jobs"

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
