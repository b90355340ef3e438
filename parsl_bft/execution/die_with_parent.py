"""``python -m parsl_bft.execution.die_with_parent CMD ...``: run CMD, and end it when the process that started
this one dies, however it dies (``kill -9``, the OOM killer).

The HTEX interchange runs under it: when ``parsl-bft run`` is killed outright, the interchange goes with it, its
worker pools lose it and exit after their heartbeat threshold, and the ranks go with their workers. Without it
the interchange, the local worker pool and its ranks went on training for nobody.

It watches its parent's pid rather than ask the kernel for a parent-death signal (PR_SET_PDEATHSIG): that signal
comes when the parent *thread* ends, and Parsl starts an interchange from whichever thread adds the executor (a
network group's lane is added from the orchestrator's loop thread, which ends before Parsl's cleanup talks to
that interchange one last time: it would wait for ever). The watcher and CMD run in a process group of their own,
so a signal to the orchestrator's group (``kill -TERM -- -PGID``, ``timeout``, systemd, a terminal's Ctrl-C)
does not end the interchange under a run that is still stopping cleanly; SIGTERM sent to the watcher itself (the
orchestrator's own shutdown) is passed on to CMD, and CMD gets the parent-death signal with respect to this
watcher, whose only thread is its main one, so neither outlives the other."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from ..parent_death import signal_on_parent_death


def watch(argv: list[str], every_s: float = 0.5) -> int:
    """Run ``argv`` until it ends (its exit status) or this process's parent is gone (then end it: SIGTERM,
    SIGKILL 5 s later)."""
    parent = os.getppid()
    # a process group of its own, before the child starts (it inherits it): `kill -TERM -- -PGID`, `timeout` and
    # systemd signal the orchestrator's whole group, and a dead interchange hangs Parsl's cleanup in the
    # orchestrator (its job status poller blocks on the command channel for ever); the orchestrator's own
    # terminate() still reaches this process by pid, and is passed on
    os.setpgid(0, 0)
    child = subprocess.Popen(argv, preexec_fn=lambda: signal_on_parent_death(signal.SIGTERM))  # stdin inherited
    signal.signal(signal.SIGTERM, lambda s, _f: child.send_signal(s))
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the child has it too: the watcher keeps watching
    while True:
        try:
            return child.wait(timeout=every_s)
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            child.terminate()
            try:
                return child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()


def main(argv: list[str]) -> None:
    """Run ``argv`` under the watcher; exit with its status."""
    if not argv:
        raise SystemExit("usage: python -m parsl_bft.execution.die_with_parent CMD [ARG ...]")
    code = watch(argv)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
