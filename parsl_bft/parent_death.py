"""A process that must not outlive the one that started it: the kernel's parent-death signal (Linux
PR_SET_PDEATHSIG), for the training ranks (train/launcher.py) and the interchange's watcher
(execution/die_with_parent.py). No Parsl, no torch: both start with it."""
from __future__ import annotations

import os

PR_SET_PDEATHSIG = 1


def signal_on_parent_death(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when the thread that started it ends; False where it
    cannot (not Linux). If the parent is already gone, ``sig`` comes now (nothing would tell us later)."""
    parent = os.getppid()
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:            # the parent died before the call above
        os.kill(os.getpid(), sig)
    return True
