"""One entry point for every trace-backed idle-capacity source, and the selections users apply to them."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ..errors import BadValue
from .cache import cached
from .intervals import IdleIntervals, read_idle_intervals
from .swf import Schedule, assign_nodes, read_swf, recorded_schedule


@dataclass
class IdleSource:
    """Idle intervals plus, for job logs, the schedule they came from (for 'idle while jobs wait')."""

    intervals: IdleIntervals
    schedule: Schedule | None = None
    description: str = ""


def is_swf(path: str | Path) -> bool:
    """Whether ``path`` names an SWF job log (else it is read as idle intervals)."""
    name = Path(path).name.lower()
    return ".swf" in name


def load_source(path: str | Path, *, schedule: str = "recorded", units: str = "auto",
                variant: str = "auto", lenient: bool = False,
                progress: Callable[[int], object] | None = None) -> IdleSource:
    """Load an SWF log (replayed as ``schedule``: recorded | easy) or an idle-interval CSV."""
    p = str(path)
    if not is_swf(p):
        iv = read_idle_intervals(p, lenient=lenient)
        return IdleSource(iv, None, f"idle-interval log {Path(p).name}: {iv.n_nodes} nodes")
    if schedule not in ("recorded", "easy"):
        raise BadValue(f"unknown schedule {schedule!r}: use recorded or easy")
    return cached(p, {"schedule": schedule, "units": units, "variant": variant, "lenient": lenient},
                  lambda: _load_swf(p, schedule, units, variant, lenient, progress))


def _load_swf(p: str, schedule: str, units: str, variant: str, lenient: bool,
              progress: Callable[[int], object] | None) -> IdleSource:
    """Parse an SWF log, replay its schedule and assign nodes (what ``idle.cache`` keeps)."""
    trace = read_swf(p, units=units, variant=variant, lenient=lenient)
    if schedule == "easy":
        from .easy import easy_schedule
        sched = easy_schedule(trace, progress=progress)
    else:
        sched = recorded_schedule(trace)
    iv = assign_nodes(sched, source=p)
    skipped = ", ".join(f"{v} {k}" for k, v in trace.skipped.items())
    desc = (f"SWF {Path(p).name}: {len(trace)} jobs, {iv.n_nodes} nodes"
            f"{f' ({trace.cores_per_node} cores each)' if trace.units == 'cores' else ''}, "
            f"{schedule} schedule, variant {trace.variant}" + (f"; ignored {skipped}" if skipped else ""))
    return IdleSource(iv, sched, desc)


_DUR = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '24h', '3d', '1w' -> seconds."""
    m = _DUR.match(text.strip().lower())
    if not m:
        raise BadValue(f"not a duration: {text!r} (use e.g. 3600, 90s, 15m, 24h, 3d, 1w)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def parse_time(text: str, origin: float) -> float:
    """Absolute unix seconds, an ISO date/time (UTC), or '+DURATION' after ``origin``."""
    s = text.strip()
    if s.startswith("+"):
        return origin + parse_duration(s[1:])
    try:
        t = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(t):          # nan replayed nothing, silently
            raise BadValue(f"not a time: {text!r} (a finite number of unix seconds)")
        return t
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise BadValue(f"not a time: {text!r} (use unix seconds, 2022-03-01[T12:00], or +2d from the "
                       "start)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def parse_window(text: str, t0: float) -> tuple[float, float | None]:
    """'START/END' or 'START/+DURATION' or 'START' (to the end). START may be '+2d' (after the trace start)."""
    a, _, b = text.partition("/")
    start = parse_time(a, t0) if a else t0
    if not b:
        return start, None
    end = start + parse_duration(b[1:]) if b.startswith("+") else parse_time(b, t0)
    if end <= start:
        raise BadValue(f"window {text!r} ends before it starts")
    return start, end


def mask_outages(iv: IdleIntervals, *, threshold: float = 0.9, min_duration: float = 3600.0) -> IdleIntervals:
    """Cut periods of at least ``min_duration`` where >= ``threshold`` of the machine is idle.

    Such stretches are maintenance, drained machines or gaps in the log, not backfill holes: counting them
    would overstate the capacity a training job could ever have used. The result records them in ``masked``.
    """
    times, counts = iv.idle_count()
    if len(times) == 0:
        return iv
    high = counts >= threshold * iv.n_nodes
    edges = np.append(times[1:], iv.t1)
    d = np.diff(np.concatenate([[0], high.astype(np.int8), [0]]))
    a_s, b_s = times[d[:-1] == 1], edges[np.flatnonzero(d[1:] == -1)]
    periods = [(float(a), float(b)) for a, b in zip(a_s, b_s) if b - a >= min_duration]
    if not periods:
        return IdleIntervals(iv.names, iv.node, iv.start, iv.end, iv.t0, iv.t1, iv.source, [])
    # intersect every interval with the live (unmasked) stretches between the periods
    live_a = np.array([iv.t0] + [b for _, b in periods])
    live_b = np.array([a for a, _ in periods] + [iv.t1])
    first = np.searchsorted(live_b, iv.start, side="right")
    last = np.searchsorted(live_a, iv.end, side="left") - 1
    node, start, end = [iv.node], [np.maximum(iv.start, live_a[np.minimum(first, len(live_a) - 1)])], []
    end.append(np.minimum(iv.end, live_b[np.minimum(first, len(live_b) - 1)]))
    for k in np.flatnonzero(last > first):          # the few intervals that span a masked period
        for p in range(first[k] + 1, last[k] + 1):
            node.append(iv.node[k:k + 1])
            start.append(np.array([max(iv.start[k], live_a[p])]))
            end.append(np.array([min(iv.end[k], live_b[p])]))
    out = IdleIntervals.build(iv.names, np.concatenate(node), np.concatenate(start), np.concatenate(end), iv.t0,
                              iv.t1, iv.source)
    out.masked = periods
    return out
