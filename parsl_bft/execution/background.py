"""The orchestrator's loop in a thread of its own (``Orchestrator.start``): the workflow's thread waits for the
jobs or stops the loop; what the loop returned or raised comes back at ``stop``. It reads the jobs' futures
through the inbox only (inbox.py): the loop's thread owns everything else."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from .errors import RunStopped
from .events import RunEnd
from .inbox import Inbox
from .report import RunSummary


class BackgroundLoop:
    """One background run: its thread, when it started, and what it returned (``summary``) or raised."""

    def __init__(self, inbox: Inbox, state_dir: Path) -> None:
        self.inbox, self.state_dir = inbox, state_dir
        self.thread: threading.Thread | None = None
        self.started_at = 0.0
        # written by the loop's thread before it ends, read by stop() after joining it
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None

    def start(self, run: Callable[[], RunSummary], started_at: float) -> None:
        """Run ``run`` in the background (once); an error it raises reaches every job's future not done yet."""
        if self.thread is not None:
            return

        def loop() -> None:
            try:
                self.summary = run()
            except BaseException as e:  # reaches every waiting future instead
                self.error = e
                for _, f in self.inbox.futures():
                    if not f.done():
                        f.set_exception(e)
        self.thread = threading.Thread(target=loop, name="parsl-bft-orchestrator", daemon=True)
        self.started_at = started_at
        self.thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until every submitted job is done (True) or ``timeout_s`` passed (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not all(f.done() for _, f in self.inbox.futures()):
            if self.thread is not None and not self.thread.is_alive():
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return all(f.done() for _, f in self.inbox.futures())

    def stop(self, why: str | None) -> RunSummary | None:
        """Ask the loop to leave and wait until it has; futures of jobs not done get ``RunStopped``. The loop's
        error is raised here (not a Ctrl-C's: the session raises that itself)."""
        self.inbox.stop(why or RunEnd.STOPPED)
        if self.thread is not None:
            self.thread.join()
        for name, f in self.inbox.futures():
            if not f.done():
                f.set_exception(RunStopped(f"job {name!r} was not done when the run stopped; its newest checkpoint "
                                           f"is kept: run again with state directory {self.state_dir} to continue"))
        if self.error is not None and not isinstance(self.error, KeyboardInterrupt):
            raise self.error
        return self.summary
