"""A job's ``metrics.csv``, beside its checkpoints: one row per training step with what the loop recorded (the
step, its loss, the world size, what ``ctx.report()`` got, the evaluation metrics at the steps where
``evaluate()`` ran). Rank 0 appends; fragment after fragment the file grows as one history.

A fragment may train past its last save and then die: its rows past that save are not the job's history (the
next fragment trains those steps again from the save). So the first write of a fragment drops the rows past the
step it restored, and fills in rows up to it that the file lacks from the checkpoint's own metrics (a file lost,
or a job whose checkpoints moved to another site). Columns are the union of the keys seen, in the order first
seen; a new key rewrites the file with the wider header (atomically), an empty cell means "not at this step".
"""
from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

FILENAME = "metrics.csv"
FIRST = ("step", "loss", "world")          # always the first columns


def read_metrics(path: str | Path) -> tuple[list[str], list[dict[str, float]]]:
    """The columns and rows of a metrics.csv (empty cells left out of a row); ([], []) when there is none."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            rows = [{k: float(v) for k, v in r.items() if k in columns and v not in ("", None)} for r in reader]
    except FileNotFoundError:
        return [], []
    return columns, [r for r in rows if "step" in r]


def _cell(v: float) -> str:
    if math.isfinite(v) and v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return f"{v:.8g}"


class MetricsLog:
    """Rank 0's writer of one job's metrics.csv."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.columns: list[str] = []
        self.resumed = False

    def resume(self, step: int, history: Iterable[Mapping[str, float]]) -> None:
        """The fragment stands at ``step`` (restored; 0 for a fresh job): rows past it are dropped, rows up to it
        that the file lacks are taken from ``history`` (the checkpoint's metrics)."""
        columns, rows = read_metrics(self.path)
        kept = [r for r in rows if r["step"] <= step]
        have = {int(r["step"]) for r in kept}
        missing = [dict(m) for m in history if "step" in m and int(m["step"]) not in have and m["step"] <= step]
        merged = sorted(kept + missing, key=lambda r: r["step"])
        self.columns = _columns(columns, merged)
        if len(merged) != len(rows) or missing or not self.path.exists():
            self._rewrite(merged)
        self.resumed = True

    def append(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Rows of steps after the file's last (``resume`` first)."""
        assert self.resumed, "MetricsLog.resume() comes first"
        if not rows:
            return
        wider = _columns(self.columns, rows)
        if wider != self.columns:
            _, old = read_metrics(self.path)
            self.columns = wider
            self._rewrite([*old, *rows])
            return
        with open(self.path, "a", newline="") as f:
            self._write(f, rows)

    def _rewrite(self, rows: Sequence[Mapping[str, float]]) -> None:
        tmp = self.path.with_name(f".{FILENAME}.{os.getpid()}")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerow(self.columns)
            self._write(f, rows)
        os.replace(tmp, self.path)

    def _write(self, f: object, rows: Iterable[Mapping[str, float]]) -> None:
        w = csv.writer(f)   # type: ignore[arg-type]   # an open text file
        w.writerows([_cell(float(r[c])) if c in r else "" for c in self.columns] for r in rows)


def _columns(columns: list[str], rows: Iterable[Mapping[str, float]]) -> list[str]:
    """``columns`` widened by the keys of ``rows`` not in them yet, in the order first seen (step, loss, world
    first)."""
    out = list(columns) or list(FIRST)
    for r in rows:
        out += [k for k in r if k not in out]
    return out
