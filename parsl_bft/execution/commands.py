"""The seam every scheduler command goes through: build argv -> run -> parse (per back end) into typed records.
Tests pass a runner that answers from recorded output."""
from __future__ import annotations

import subprocess
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Protocol

from ..errors import ParslBftError

Runner = Callable[[list[str]], tuple[int, str, str]]


def run_local(argv: list[str], timeout: float = 30.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``argv`` on this host: (exit status, stdout, stderr); a command that hangs past ``timeout`` raises
    ``subprocess.TimeoutExpired``."""
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


class SchedulerError(ParslBftError, RuntimeError):
    """A scheduler command that failed: its argv, exit status and error output (the first 300 characters in the
    message). Still a RuntimeError, as it always was."""

    def __init__(self, argv: list[str], rc: int, err: str):
        super().__init__(f"{' '.join(argv[:2])} failed (exit {rc}): {err.strip()[:300]}")
        self.argv, self.rc, self.err = argv, rc, err


class NoJobId(ParslBftError, ValueError):
    """A submit command that exited 0 but printed no job id: the scheduler's answer, not a bug (a ValueError, as it
    always was; not a SchedulerError, so not counted as a refusal)."""

    def __init__(self, command: str, output: str):
        super().__init__(f"{command} printed no job id: {output.strip()[:200]!r}")


class SchedulerCommands:
    """Base of SlurmCommands and PBSCommands: runs argv through ``runner``; ``error`` is the back end's type."""

    error: type[SchedulerError] = SchedulerError

    def __init__(self, runner: Runner = run_local):
        self._runner = runner
        self.calls: deque[tuple[float, str]] = deque(maxlen=10_000)   # (monotonic time, command): what admins count

    def runner(self, argv: list[str]) -> tuple[int, str, str]:
        """Run one command through the runner, counted in ``calls``."""
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

    def _run(self, argv: list[str], ok_codes: Collection[int] = (0,)) -> tuple[str, str]:
        rc, out, err = self.runner(argv)
        if rc not in ok_codes:
            raise self.error(argv, rc, err or out)
        return out, err


class BatchCommands(Protocol):
    """The part of a back end's command seam the scheduler-independent pilot code uses."""

    def submit(self, script_path: str) -> str:
        """Submit a batch script; its job id."""

    def cancel(self, job_ids: list[str]) -> None:
        """Cancel these jobs (ids the scheduler no longer knows are no error)."""
