"""The best checkpoint by a named metric (``TrainingJob(keep_best="val_loss")``), kept beside the newest ones.

A metric belongs to the weights at the step it was measured at, so only a checkpoint written at a step whose
metrics row holds the metric is a candidate: the built-in loop saves at every step where ``evaluate()`` gave it;
a user's loop saves (``ctx.save``) at a step where it reported it. The best candidate is ``best.h5`` in the job's
folder, a hard link to that checkpoint file (no bytes copied; it stays when retention deletes the checkpoint), and
``best.json`` says which metric, its value and the step. Rank 0 alone writes them, after a checkpoint is on disk.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadValue

BEST = "best.h5"
BEST_INFO = "best.json"


@dataclass(frozen=True)
class BestRule:
    """Which metric, and whether higher is better (``max:accuracy``) or lower (``val_loss``, ``min:val_loss``)."""

    metric: str
    higher: bool = False

    @classmethod
    def parse(cls, spec: str) -> BestRule:
        """``"NAME"``, ``"min:NAME"`` or ``"max:NAME"``; anything else is refused naming the forms."""
        if not isinstance(spec, str):
            raise BadValue(f"keep_best names a metric ('val_loss', 'max:accuracy'), got {str(spec)[:40]!r}")
        mode, _, name = spec.rpartition(":")
        if mode not in ("", "min", "max") or not name.strip() or name != name.strip():
            raise BadValue(f"keep_best {spec[:60]!r}: write a metric's name ('val_loss': lowest is best) or "
                           "'max:NAME' (highest is best) or 'min:NAME'")
        return cls(name, mode == "max")

    def better(self, value: float, than: float) -> bool:
        """Whether ``value`` beats ``than`` (a tie keeps the earlier one)."""
        return value > than if self.higher else value < than


def value_at(step: int, rows: Sequence[Mapping[str, float]], metric: str) -> float | None:
    """The metric in the metrics row of ``step`` (None: not measured at that step, or not a finite number)."""
    for row in reversed(rows):
        if row.get("step") == step:
            v = row.get(metric)
            return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
    return None


def read_best(job_dir: str | Path) -> dict[str, Any] | None:
    """What ``best.json`` says (metric, value, step, higher), or None when no best was kept."""
    try:
        info = json.loads((Path(job_dir) / BEST_INFO).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def keep_if_best(rule: BestRule, checkpoint: Path, step: int, rows: Sequence[Mapping[str, float]]) -> bool:
    """Make ``checkpoint`` (written at ``step``, whose recent metrics rows are ``rows``) the job's best when its
    metric beats the kept one. Returns whether it did."""
    value = value_at(step, rows, rule.metric)
    if value is None:
        return False
    d = checkpoint.parent
    kept = read_best(d)
    if kept is not None and kept.get("metric") == rule.metric and kept.get("higher") == rule.higher \
            and not rule.better(value, float(kept["value"])):
        return False
    tmp = d / f".{BEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(checkpoint, tmp)
    except OSError:                 # a file system without hard links: a copy
        shutil.copyfile(checkpoint, tmp)
    os.replace(tmp, d / BEST)
    info = {"metric": rule.metric, "value": value, "step": step, "higher": rule.higher, "from": checkpoint.name}
    tmp_info = d / f".{BEST_INFO}.{os.getpid()}"
    tmp_info.write_text(json.dumps(info))
    os.replace(tmp_info, d / BEST_INFO)
    return True
