"""The seam every scheduler command goes through: build argv -> run -> parse (per back end) into typed records.
Tests pass a runner that answers from recorded output."""
from __future__ import annotations

import subprocess
import time
from collections import deque
from typing import Callable

Runner = Callable[[list[str]], tuple[int, str, str]]


def run_local(argv: list[str], timeout: float = 30.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


class SchedulerError(RuntimeError):
    def __init__(self, argv: list[str], rc: int, err: str):
        super().__init__(f"{' '.join(argv[:2])} failed (exit {rc}): {err.strip()[:300]}")
        self.argv, self.rc, self.err = argv, rc, err


class SchedulerCommands:
    """Base of SlurmCommands and PBSCommands: runs argv through ``runner``; ``error`` is the back end's type."""

    error: type[SchedulerError] = SchedulerError

    def __init__(self, runner: Runner = run_local):
        self._runner = runner
        self.calls: deque[tuple[float, str]] = deque(maxlen=10_000)   # (monotonic time, command): what admins count

    def runner(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append((time.monotonic(), argv[0]))
        return self._runner(argv)

    def per_minute(self, window_s: float = 60.0) -> dict[str, float]:
        """Commands per minute by name over the last ``window_s`` seconds."""
        t = time.monotonic() - window_s
        out: dict[str, float] = {}
        for ts, name in self.calls:
            if ts >= t:
                out[name] = out.get(name, 0.0) + 60.0 / window_s
        return out

    def _run(self, argv: list[str], ok_codes=(0,)) -> tuple[str, str]:
        rc, out, err = self.runner(argv)
        if rc not in ok_codes:
            raise self.error(argv, rc, err or out)
        return out, err
