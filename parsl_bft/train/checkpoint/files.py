"""Where a save is written before it is renamed into place, and the fault points the chaos tests arm."""
from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = socket.gethostname().replace("-", "_")
STALE_FOREIGN_S = 3600.0     # another host's temporary untouched this long: its writer is gone


def temporary(path: Path) -> Path:
    """Where a save is written before it is renamed into place: named by host AND pid, because pids of other
    nodes (a job directory on a shared file system) mean nothing here."""
    return path.with_name(f".{path.name}.tmp-{HOST}-{os.getpid()}")


def fault(point: str) -> None:
    """Fault injection for tests: PARSL_BFT_FAULT=<point> kills this process (SIGKILL) at that point. A chaos
    test arms one-shot kills instead: a file named <point> in the directory PARSL_BFT_CHAOS_ARM is claimed
    (renamed, so exactly one process fires it) by the next process that reaches the point."""
    kill = os.environ.get("PARSL_BFT_FAULT") == point
    arm = os.environ.get("PARSL_BFT_CHAOS_ARM")
    if arm and not kill:
        trigger = Path(arm) / point.replace(":", "_")
        try:
            os.rename(trigger, trigger.with_name(f"{trigger.name}.fired-{HOST}-{os.getpid()}"))
            kill = True
        except OSError:
            pass
    if kill:
        os.kill(os.getpid(), 9)
