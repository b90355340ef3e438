"""The one SIGTERM path: in the main thread SIGTERM raises ``Terminated``, a KeyboardInterrupt, so a batch
system's termination unwinds a run exactly as a terminal's Ctrl-C does (fragments checkpoint, pilots are given
back) and callers need to handle one kind of interruption."""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from .events import RunEnd


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; it unwinds like Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
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
