"""The one SIGTERM path: in the main thread SIGTERM raises ``Terminated``, a KeyboardInterrupt, so a batch
system's termination unwinds a run exactly as a terminal's Ctrl-C does (fragments checkpoint, pilots are given
back) and callers need to handle one kind of interruption."""
from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from .events import RunEnd


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; it unwinds like Ctrl-C."""


RETRY_S = 0.05        # a signal that finds this thread holding logging's lock comes again this much later


def deferred_while_logging(signum: int) -> bool:
    """If this thread holds logging's module lock, send ``signum`` again shortly and say so (True). An exception
    raised between the lock's acquire and the ``try`` that releases it leaves it held, and every thread that logs
    (Parsl's) then waits forever: a remote session cancelled 2 s after it started hung so."""
    owned = getattr(getattr(logging, "_lock", None), "_is_owned", None)
    if owned is None or not owned():
        return False
    threading.Timer(RETRY_S, os.kill, (os.getpid(), signum)).start()
    return True


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if not deferred_while_logging(signum):
        raise Terminated("SIGTERM")


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` in the main thread (elsewhere the block runs unchanged:
    only the main thread may set handlers, and the main thread's own handler then governs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def stop_reason(e: BaseException) -> str:
    """Why a run stopped, as the event log records it (``RunEnd``; an error's words with it)."""
    if isinstance(e, Terminated):
        return RunEnd.SIGTERM
    if isinstance(e, KeyboardInterrupt):
        return RunEnd.INTERRUPTED
    return RunEnd.error(e)
