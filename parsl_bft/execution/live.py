"""Live per-job progress for a running orchestrator: the demo's, and `parsl-bft run`'s on stderr. Bars (rich) on
a terminal; plain lines at a steady interval otherwise (nohup, a batch job's output file, a remote session's
log), so a run that is not watched still says how it goes."""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .ledger import RunLedger

if TYPE_CHECKING:
    from typing import Self

    from .orchestrator import Orchestrator

PLAIN_EVERY_S = 30.0


class LiveBars:
    """A progress callback for ``Orchestrator.run/start``: one bar per job (jobs submitted later get theirs when
    they arrive), filled from the fragments' live progress reports, with where each job stands by the event log
    (running on how many nodes from its fragment's launch until it ends, waiting, done, failed, stopped and why).
    Use it as a context manager around the run. When the console is not a terminal, a line per job every
    ``every_s`` seconds (and a last one at the end) instead."""

    def __init__(self, console: Console | None = None, *, every_s: float = PLAIN_EVERY_S,
                 plain_to: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        console = console or Console(stderr=True)
        self.plain = None if console.is_terminal else (plain_to or sys.stderr)
        self.every_s, self._last_line = every_s, -float("inf")
        self.bar = Progress(TextColumn("{task.description:>10}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                            TextColumn("{task.fields[nodes]}"), TextColumn("{task.fields[loss]}"),
                            TextColumn("{task.fields[speed]}"), TimeElapsedColumn(), console=console)
        self.clock, self.rates = clock, Rates()
        self.tasks: dict[str, TaskID] = {}
        self._orch: Orchestrator | None = None
        self._ledger: RunLedger | None = None
        self._seen = 0                       # the event log's rows read so far

    def __enter__(self) -> Self:
        if self.plain is None:
            self.bar.start()
        else:       # the workers' start-up is the quiet stretch before the first line (seconds to a minute)
            print(f"parsl-bft {time.strftime('%H:%M:%S')} starting workers", file=self.plain, flush=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._orch is not None:          # the last word: where every job stands as the bars close
            self._last_line = -float("inf")
            self(self._orch)
        if self.plain is None:
            self.bar.stop()

    def __call__(self, orch: Orchestrator) -> None:
        """Update every job's bar (or, without a terminal, print its line when one is due) from ``orch`` (the
        orchestrator calls this as it runs)."""
        self._orch = orch
        if self._ledger is None:
            self._ledger = RunLedger({})
        for n, j in list(orch.jobs.items()):
            self._ledger.batch.setdefault(n, j.global_batch)
        self._seen, new = orch.db.events_after(self._seen)
        self._ledger.feed(new)
        now = self.clock()
        # a job submitted from another thread is in live_progress (the inbox's) a turn before the loop has added
        # it to orch.jobs: it shows from the next turn
        rows = [(name, done, *self._state(orch, name), self.rates.words(name, done, orch.jobs[name].samples, now))
                for name, done in orch.live_progress().items() if name in orch.jobs]
        if self.plain is not None:
            if now - self._last_line >= self.every_s:
                self._last_line = now
                stamp = time.strftime("%H:%M:%S")
                for name, done, nodes, loss, speed in rows:
                    total = orch.jobs[name].samples
                    print(f"parsl-bft {stamp} {name}: {100 * done / max(total, 1):.1f}% of {total:,.0f} samples, "
                          f"{nodes}{', ' + loss if loss else ''}{', ' + speed if speed else ''}", file=self.plain,
                          flush=True)
            return
        for name, done, nodes, loss, speed in rows:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(name, total=orch.jobs[name].samples, nodes="", loss="",
                                                     speed="")
            self.bar.update(self.tasks[name], completed=done, nodes=nodes, loss=loss, speed=speed)

    def _state(self, orch: Orchestrator, name: str) -> tuple[str, str]:
        """(where the job stands, by the event log; its last loss) for display."""
        assert self._ledger is not None
        p = orch.last_report(name)
        return self._ledger.job(name).state, f"loss {p.loss:.4g}" if p is not None and p.loss == p.loss else ""


class Rates:
    """Each job's training speed over the last ``window_s`` seconds of its progress (samples done as seen at
    each update), and the time left at that speed."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.seen: dict[str, deque[tuple[float, float]]] = {}

    def words(self, name: str, done: float, total: float, now: float) -> str:
        """'1,234 samples/s, ETA 3m05s' (no ETA when done or not moving); "" until two updates show a speed."""
        pts = self.seen.setdefault(name, deque())
        pts.append((now, done))
        while len(pts) > 2 and pts[1][0] <= now - self.window_s:
            pts.popleft()
        (t0, d0), (t1, d1) = pts[0], pts[-1]
        if t1 - t0 < 1.0 or done >= total:
            return ""
        rate = max(d1 - d0, 0.0) / (t1 - t0)
        if rate <= 0:
            return "0 samples/s"
        return f"{rate:,.0f} samples/s, ETA {_duration((total - done) / rate)}"


def _duration(s: float) -> str:
    n = round(s)
    if n >= 3600:
        return f"{n // 3600}h{n % 3600 // 60:02d}m"
    return f"{n // 60}m{n % 60:02d}s" if n >= 60 else f"{n}s"
