"""Which site file each run id was submitted with from this machine, so ``parsl-bft status RUN_ID`` needs no
--site (``$PARSL_BFT_HOME``, default ~/.parsl-bft, ``remote-runs.json``). Standard library only: the CLI reads it
to decide whether ``status X`` is a remote run."""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path


def registry_path() -> Path:
    """Where the run id -> site file map lives."""
    return Path(os.environ.get("PARSL_BFT_HOME") or Path.home() / ".parsl-bft") / "remote-runs.json"


def remember(run_id: str, site_file: str | Path) -> None:
    """Under a lock, through a temporary file of this process's own: submits from several shells at once
    (a sweep) must neither lose each other's runs nor fail on each other's temporary file."""
    p = registry_path()
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(p.with_name(p.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = known_runs()
        runs[run_id] = str(Path(site_file).resolve())
        tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(runs, indent=1))
        os.replace(tmp, p)


def known_runs() -> dict[str, str]:
    """Run id -> the site file it was submitted with (empty when none, or the file is unreadable)."""
    try:
        runs = json.loads(registry_path().read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return runs if isinstance(runs, dict) else {}
