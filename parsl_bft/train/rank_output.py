"""A rank's output: fd 1 and 2 go to a log file of its own, each line stamped with its time, kept near a size."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, TextIO

LOG_MAX = 64 << 20         # bytes of one rank's output kept (a loop printing in a tight loop wrote 3 GB in 70 s)


def _cap_log(limit: int, every_s: float = 1.0) -> None:
    """Keep this rank's log (fd 1 and 2) near ``limit`` bytes: whatever grows past it is cut off, once a second,
    under a note (the first ``limit`` bytes stay; a failed rank's traceback is kept apart, in .errors/)."""
    note = f"\n[parsl-bft: output beyond {limit:,} bytes dropped]\n".encode()
    while True:
        time.sleep(every_s)
        try:
            if os.fstat(1).st_size > limit + len(note):
                os.ftruncate(1, limit)
                os.write(1, note)
        except OSError:
            return


class _Stamped:
    """A rank's ``sys.stdout`` / ``sys.stderr``: each line begins with the time it was written (prints, warnings,
    tracebacks; what C code writes to the descriptors itself - gloo, NCCL - is not stamped)."""

    def __init__(self, f: TextIO) -> None:
        self._f, self._line_start = f, True

    def write(self, s: str) -> int:
        if not s:
            return 0
        stamp = time.strftime("%Y-%m-%d %H:%M:%S ")
        out = (stamp if self._line_start else "") + s.replace("\n", "\n" + stamp)
        self._line_start = s.endswith("\n")
        self._f.write(out[: -len(stamp)] if self._line_start else out)
        return len(s)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:      # flush, fileno, isatty, encoding, buffer: the file's own
        return getattr(self._f, name)


def output_to_log(log_path: str, limit: int) -> None:
    """From now on this process writes to ``log_path`` (fd 1 and 2, ``sys.stdout``/``sys.stderr`` stamped), cut
    near ``limit`` bytes."""
    # a file, not a pipe: a chatty rank must never block on its output; appending, so that _cap_log can cut it
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    threading.Thread(target=_cap_log, args=(limit,), daemon=True).start()
    sys.stdout = _Stamped(open(1, "w", buffering=1, closefd=False))   # noqa: SIM115 (the rank's, until it exits)
    sys.stderr = _Stamped(open(2, "w", buffering=1, closefd=False))   # noqa: SIM115
