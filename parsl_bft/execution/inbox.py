"""Who may change the orchestrator's state, and how the other threads reach it.

The rule: one thread at a time owns the orchestrator's mutable state (its tables of jobs, futures, curves,
layers and sites, the running fragments, the arrivals, the noticed nodes, the plan's books) and makes its
database writes. While a loop runs (``run()``: in the caller's thread, or in ``start()``'s background thread)
that thread owns it, from ``run()``'s first line to its last. When no loop runs, a caller owns it for as long
as it holds the inbox's lock (a ``submit`` before ``run()``, ``stop()`` after the loop has ended). Every other
thread - the workflow's ``submit``, ``wait`` and ``stop``, the callbacks of the futures a job's
``workload_args`` waited for (they run in whatever thread resolved them: Parsl's) - reaches the state through
the ``Inbox``: a submission becomes a ``Submit`` message that the loop takes at its next turn; a stop is an
event with its reason.

Why messages rather than one lock around the state: a Parsl future's callback runs in Parsl's own thread. Had
it to wait for a lock that the loop holds for a turn, Parsl's result handling would stand still for that long,
and a turn that waits on Parsl (the shutdown waits for fragments' results) could wait on itself. Posting never
waits on the loop and the loop never waits on a poster: no such cycle can form. The price is a small front
desk: the inbox keeps its own table of the jobs submitted (name -> spec and future) under its lock, so that a
job submitted again is checked at once, and ``wait()`` and ``stop()`` see every future without reading the
loop's tables.

Enforced: the orchestrator's methods that change its state start with ``Inbox.check_owner()``, an assertion
(active in tests; ``python -O`` drops it) that the calling thread owns the state now.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .events import RunEnd
from .training_job import TrainingJob, check_same_spec

__all__ = ["Inbox", "Submit"]


@dataclass(frozen=True, kw_only=True)
class Submit:
    """A job to add to the orchestrator's tables (and its database), with the future ``submit`` returned."""

    job: TrainingJob
    future: Future[str | None] = field(default_factory=Future)


class Inbox:
    """The orchestrator's front desk: its owner thread, the messages waiting for the owner, every job submitted
    (name -> spec and future) and the stop request (see the module's docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.stopping = threading.Event()       # set once: the loop leaves at its next turn
        self._lock = threading.RLock()           # guards everything below
        self._holder: int | None = None          # the thread holding _lock, and how deeply
        self._depth = 0
        self._owner: int | None = None           # the thread running the loop; None: no loop runs
        self._queue: deque[Submit] = deque()
        self._jobs: dict[str, tuple[TrainingJob, Future[str | None]]] = {}
        self._stop_why: str = RunEnd.STOPPED

    @contextmanager
    def _held(self) -> Iterator[None]:
        with self._lock:
            self._depth += 1
            self._holder = threading.get_ident()
            try:
                yield
            finally:
                self._depth -= 1
                if not self._depth:
                    self._holder = None

    # --- ownership ---------------------------------------------------------------------------------------------
    def owned(self) -> bool:
        """Does the calling thread own the orchestrator's state now (it runs the loop, or no loop runs and it
        holds the inbox's lock)?"""
        me = threading.get_ident()
        return self._owner == me or (self._owner is None and self._holder == me)

    def check_owner(self, what: str) -> None:
        """The assertion at the top of every method that changes the orchestrator's state."""
        assert self.owned(), (f"{what} called in thread {threading.current_thread().name!r}, which does not own "
                              "the orchestrator's state (parsl_bft/execution/inbox.py)")

    @contextmanager
    def direct(self) -> Iterator[None]:
        """Own the state for a moment while no loop runs (the constructor reading the database back)."""
        with self._held():
            assert self._owner is None, "the loop owns the orchestrator's state"
            yield

    @contextmanager
    def own(self, apply: Callable[[Submit], None]) -> Iterator[None]:
        """The calling thread runs the loop: it owns the state until the block ends; messages still waiting
        then are applied (``apply``) before the state goes back to whoever holds the lock."""
        with self._held():
            assert self._owner is None, "a loop already runs"
            self._owner = threading.get_ident()
        try:
            yield
        finally:
            with self._held():
                try:
                    while self._queue:
                        apply(self._queue.popleft())
                finally:
                    self._owner = None

    def take(self) -> list[Submit]:
        """The owner takes the messages waiting, oldest first."""
        self.check_owner("Inbox.take")
        with self._held():
            out = list(self._queue)
            self._queue.clear()
        return out

    # --- what any thread may call ------------------------------------------------------------------------------
    def known(self, job: TrainingJob) -> Future[str | None] | None:
        """The future of a job of that name submitted before (the same spec, or ValueError saying what
        changed); None: a new job."""
        with self._held():
            got = self._jobs.get(job.name)
        if got is None:
            return None
        check_same_spec(got[0], job, self.state_dir)
        return got[1]

    def submit(self, job: TrainingJob, apply: Callable[[Submit], None]) -> Future[str | None]:
        """A job checked already: its message goes to the loop, or, when no loop runs, is applied here and now
        (``apply``, under the lock). A job of that name submitted meanwhile: that job's future."""
        with self._held():
            old = self.known(job)
            if old is not None:
                return old
            msg = Submit(job=job)
            self._jobs[job.name] = (job, msg.future)
            if self._owner is not None:
                self._queue.append(msg)
                return msg.future
            try:
                apply(msg)
            except BaseException:
                del self._jobs[job.name]
                raise
            return msg.future

    def register(self, job: TrainingJob, future: Future[str | None]) -> None:
        """A job the owner found in the state database."""
        self.check_owner("Inbox.register")
        with self._held():
            self._jobs[job.name] = (job, future)

    def futures(self) -> list[tuple[str, Future[str | None]]]:
        """Every job's future, by name (a copy: later submissions do not change it)."""
        with self._held():
            return [(n, f) for n, (_, f) in self._jobs.items()]

    def jobs(self) -> dict[str, TrainingJob]:
        """Every job's spec, by name (a copy)."""
        with self._held():
            return {n: j for n, (j, _) in self._jobs.items()}

    def stop(self, why: str) -> None:
        """Ask the loop to leave, saying why (the event log's reason)."""
        with self._held():
            self._stop_why = why
        self.stopping.set()

    @property
    def stop_reason(self) -> str:
        """Why ``stop`` was asked ("stopped" until it is)."""
        with self._held():
            return self._stop_why
