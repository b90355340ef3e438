"""Live per-job progress bars (rich) for a running orchestrator: the demo's, and `parsl-bft run`'s on stderr."""
from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from typing import Self

    from .orchestrator import Orchestrator


class LiveBars:
    """A progress callback for ``Orchestrator.run/start``: one bar per job (jobs submitted later get theirs when
    they arrive), filled from the fragments' live progress reports, with the nodes each job holds now. Use it as
    a context manager around the run."""

    def __init__(self, console: Console | None = None):
        self.bar = Progress(TextColumn("{task.description:>10}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                            TextColumn("{task.fields[nodes]}"), TextColumn("{task.fields[loss]}"), TimeElapsedColumn(),
                            console=console or Console(stderr=True))
        self.tasks: dict[str, TaskID] = {}
        self._orch: Orchestrator | None = None

    def __enter__(self) -> Self:
        self.bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._orch is not None:          # the last word: where every job stands as the bars close
            self(self._orch)
        self.bar.stop()

    def __call__(self, orch: Orchestrator) -> None:
        """Update every job's bar from ``orch`` (the orchestrator calls this as it runs)."""
        self._orch = orch
        live = orch.live_progress()
        for name, done in live.items():
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(name, total=orch.jobs[name].samples, nodes="", loss="")
            r = orch.running.get(name)
            p = orch.last_report(name)
            finished = orch.futures[name].done()
            self.bar.update(self.tasks[name], completed=done,
                            nodes="done" if finished else f"{r.nodes} node(s)" if r else "waiting",
                            loss=f"loss {p.loss:.4g}" if p is not None and p.loss == p.loss else "")
