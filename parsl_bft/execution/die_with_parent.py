"""``python -m parsl_bft.execution.die_with_parent CMD ...``: exec CMD so that it is killed (SIGTERM) when the
process that started it dies, however it dies (Linux PR_SET_PDEATHSIG; elsewhere CMD runs plainly).

The HTEX interchange runs as such a child of the orchestrator: when ``parsl-bft run`` is killed outright
(``kill -9``, the OOM killer), the interchange goes with it, its worker pools lose it and exit after their
heartbeat threshold, and the ranks go with their workers. Without it the interchange, the local worker pool and
its ranks went on training for nobody. Parsl starts the interchange from the thread that starts the executor:
the session's main thread, or the orchestrator's loop (network-group lanes), both of which live as long as the
run."""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; False where it cannot."""
    parent = os.getppid()
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:            # the parent died before the line above: nothing will tell us
        os.kill(os.getpid(), sig)
    return True


def main(argv: list[str]) -> None:
    """Exec ``argv`` (the setting survives exec) after asking to die with the parent."""
    if not argv:
        raise SystemExit("usage: python -m parsl_bft.execution.die_with_parent CMD [ARG ...]")
    die_with_parent()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
