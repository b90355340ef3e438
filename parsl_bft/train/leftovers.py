"""Nothing a fragment started outlives it: processes the user's code started (a data server, a subprocess in a
session of its own, a double-forked daemon) are found by their mark in their environment
(``PARSL_BFT_SHARE=<fragment id>/<first rank>``: the ranks one launcher started, which every process a rank starts
inherits unless it clears its environment) or as descendants of those ranks, and killed when they end. A rank is
a child subreaper (``adopt_orphans``): a daemon whose parent exits, even with a cleared environment in a session
of its own, stays the rank's descendant instead of init's, and ``kill_descendants`` ends it with the rank. Linux
(/proc, prctl); elsewhere nothing is found. No torch, no Parsl."""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

SHARE_ENV = "PARSL_BFT_SHARE"      # set for every rank (launcher._start_ranks)
PROC = Path("/proc")
PR_SET_CHILD_SUBREAPER = 36


def _processes(marker: bytes) -> tuple[dict[int, int], set[int]]:
    """Every process's parent (pid -> ppid), and this user's processes whose environment holds ``marker``."""
    parents: dict[int, int] = {}
    marked: set[int] = set()
    uid = os.getuid()
    for d in PROC.iterdir() if PROC.is_dir() else ():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_bytes()
            parents[int(d.name)] = int(stat.rsplit(b")", 1)[1].split()[1])    # the name may hold ') '
            if d.stat().st_uid == uid and marker in (d / "environ").read_bytes().split(b"\0"):
                marked.add(int(d.name))
        except (OSError, ValueError, IndexError):
            continue             # gone meanwhile, or not ours to read
    return parents, marked


def share_mark(fragment: str, first_rank: int) -> str:
    """The mark of the ranks a launcher starts for ``fragment`` from ``first_rank`` on (one node's share)."""
    return f"{fragment}/{first_rank}"


def share_processes(mark: str, roots: Iterable[int] = ()) -> set[int]:
    """The processes of a share (``share_mark``) still on this node: those marked with it, and every descendant
    of ``roots`` (its ranks' pids; a rank forked without exec keeps no new environment in /proc) or of a marked
    one. Never this process or its ancestors."""
    parents, found = _processes(f"{SHARE_ENV}={mark}".encode())
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    stack = [*found, *(r for r in roots if r in parents)]
    found.update(stack)
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in found:
                found.add(c)
                stack.append(c)
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:            # ourselves and our ancestors
        mine.add(pid)
        pid = parents.get(pid, 1)
    return found - mine


def kill_share_processes(mark: str, roots: Iterable[int] = ()) -> list[int]:
    """SIGKILL what ``share_processes`` finds (at the share's end: its ranks are done or being killed); returns
    the pids signalled."""
    pids = sorted(share_processes(mark, roots))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux prctl): its descendants orphaned later are re-parented to it,
    not to init, so they stay its descendants; False where the kernel cannot."""
    try:
        import ctypes
        return int(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process (its own children and the orphans it adopted); the pids."""
    parents, _ = _processes(b"\0")           # a marker no environment holds: the parents only
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [os.getpid()]
    while stack:
        for c in children.get(stack.pop(), []):
            found.append(c)
            stack.append(c)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found
