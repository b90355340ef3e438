"""The orchestrator's clock, injected so that its unit tests run on simulated time."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for records, and a sleep between loop turns."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""

    def time(self) -> float:
        """Unix time."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def time(self) -> float:
        """``time.time()``."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """``time.sleep()``."""
        time.sleep(seconds)


class SimulatedClock:
    """A clock that moves only when slept on: a loop turn costs no real time. ``on_sleep`` (if given) runs after
    each advance, so a test can script what happens at simulated instants."""

    def __init__(self, start: float = 1_000.0, unix_offset: float = 1.7e9) -> None:
        self.now = start
        self.unix_offset = unix_offset
        self.on_sleep: list[Callable[[SimulatedClock], object]] = []

    def monotonic(self) -> float:
        """The simulated instant."""
        return self.now

    def time(self) -> float:
        """The simulated instant as unix time."""
        return self.now + self.unix_offset

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` and run the scripted callbacks."""
        self.now += max(seconds, 0.0)
        for f in list(self.on_sleep):
            f(self)
