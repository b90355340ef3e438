"""Which site file each run id was submitted with from this machine, so ``parsl-bft status RUN_ID`` needs no
--site (``$PARSL_BFT_HOME``, default ~/.parsl-bft, ``remote-runs.json``). Standard library only: the CLI reads it
to decide whether ``status X`` is a remote run.

Its folder follows the state directory's rules: the user's own and writable by nobody else (another user's
registry could point ``status`` at a site file, and so an endpoint, of theirs); no file in it is opened through a
link, and each is made with mode 0600."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import warnings
from pathlib import Path

from ..errors import ParslBftError
from ..owned import link_of_another, untrusted


def registry_path() -> Path:
    """Where the run id -> site file map lives."""
    return Path(os.environ.get("PARSL_BFT_HOME") or Path.home() / ".parsl-bft") / "remote-runs.json"


def _distrusted(folder: Path) -> str | None:
    """Why the registry's folder is not to be used (None: it is the user's own, writable by nobody else)."""
    try:
        why = untrusted(os.stat(folder))
    except OSError:
        return None
    return why or ("is a symbolic link another user made" if link_of_another(folder) else None)


def remember(run_id: str, site_file: str | Path) -> None:
    """Under a lock, through a temporary file of this process's own: submits from several shells at once
    (a sweep) must neither lose each other's runs nor fail on each other's temporary file."""
    p = registry_path()
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    why = _distrusted(p.parent)
    if why:
        raise ParslBftError(f"the remote-run registry's folder {p.parent} {why}: set PARSL_BFT_HOME to a folder of "
                            "your own that only you can write")
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    with os.fdopen(os.open(p.with_name(p.name + ".lock"), os.O_WRONLY | os.O_CREAT | flags, 0o600), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = known_runs()
        runs[run_id] = str(Path(site_file).resolve())
        tmp = p.with_name(f".{p.name}.{secrets.token_hex(6)}.tmp")
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o600), "w") as f:
                f.write(json.dumps(runs, indent=1))
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def known_runs() -> dict[str, str]:
    """Run id -> the site file it was submitted with (empty when none, the file is unreadable, or the folder is
    not to be trusted: a warning then)."""
    p = registry_path()
    why = _distrusted(p.parent)
    if why:
        warnings.warn(f"the remote-run registry's folder {p.parent} {why}: not read", stacklevel=2)
        return {}
    try:
        with os.fdopen(os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as f:
            if untrusted(os.fstat(f.fileno())):
                return {}
            runs = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return runs if isinstance(runs, dict) else {}
