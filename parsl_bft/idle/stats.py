"""Idle-capacity statistics and the idle-nodes-over-time plot."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..extras import optional_imports
from .intervals import IdleIntervals
from .swf import Schedule


@dataclass
class IdleStats:
    """What ``parsl-bft idle`` reports about a source's idle capacity (fractions of node-time, hole shapes)."""

    nodes: int
    span_s: float
    masked_s: float
    idle_fraction_raw: float         # idle node-s / (nodes * span), outages included
    idle_fraction: float             # outages masked out of numerator and denominator
    idle_while_waiting: float | None  # idle node-s while >= 1 job waits / (nodes * unmasked span)
    time_jobs_waiting: float | None  # share of unmasked time with >= 1 job waiting
    hole_duration_s: dict[str, float]  # per-node idle interval lengths
    hole_width_nodes: dict[str, float]  # idle nodes at once, time-weighted over unmasked time
    events_per_hour: float
    intervals: int

    def as_dict(self) -> dict[str, Any]:
        """The statistics as plain data (for JSON)."""
        return asdict(self)


PCTS = (50, 90, 99)


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    if len(values) == 0 or weights.sum() <= 0:
        return {f"p{p}": 0.0 for p in PCTS}
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cw = np.cumsum(w) / w.sum()
    return {f"p{p}": float(v[min(int(np.searchsorted(cw, p / 100)), len(v) - 1)]) for p in PCTS}


def _masked_at(times: np.ndarray, periods: list[tuple[float, float]] | None) -> np.ndarray:
    m = np.zeros(len(times), dtype=bool)
    for a, b in periods or []:
        m |= (times >= a) & (times < b)
    return m


def idle_stats(raw: IdleIntervals, masked: IdleIntervals, schedule: Schedule | None = None) -> IdleStats:
    """Statistics of ``masked`` (outages cut out, see mask_outages) next to the raw idle fraction."""
    n, span = masked.n_nodes, masked.span
    masked_s = sum(b - a for a, b in masked.masked or [])
    live = span - masked_s
    raw_frac = raw.idle_node_seconds() / (raw.n_nodes * raw.span) if raw.n_nodes and raw.span > 0 else 0.0
    frac = masked.idle_node_seconds() / (n * live) if live > 0 and n else 0.0

    times, counts = masked.idle_count()
    in_mask = _masked_at(times, masked.masked)
    live_w = np.diff(np.append(times, masked.t1)) * ~in_mask
    width = _weighted_percentiles(counts, live_w)

    wait_frac = time_waiting = None
    if schedule is not None and len(times):
        wt, wc = schedule.waiting_count()
        # waiting jobs at each idle-count step: merge the two step functions on a common time grid
        grid = np.union1d(times, wt)
        grid = grid[(grid >= masked.t0) & (grid < masked.t1)]
        idle_on = counts[np.clip(np.searchsorted(times, grid, side="right") - 1, 0, None)]
        idle_on[grid < times[0]] = 0
        wpos = np.searchsorted(wt, grid, side="right") - 1
        waiting = (np.where(wpos >= 0, wc[np.clip(wpos, 0, None)], 0) > 0) if len(wc) else np.zeros(len(grid), bool)
        live_g = ~_masked_at(grid, masked.masked)
        dt = np.diff(np.append(grid, masked.t1))
        wait_frac = float(np.sum(idle_on * dt * waiting * live_g) / (n * live)) if live > 0 and n else 0.0
        time_waiting = float(np.sum(dt * waiting * live_g) / live) if live > 0 else 0.0

    durations = masked.end - masked.start
    ev_times = np.unique(np.concatenate([masked.start, masked.end]))
    hours = live / 3600.0
    return IdleStats(
        nodes=n, span_s=span, masked_s=masked_s, idle_fraction_raw=raw_frac, idle_fraction=frac,
        idle_while_waiting=wait_frac, time_jobs_waiting=time_waiting,
        hole_duration_s={f"p{p}": float(np.percentile(durations, p)) if len(durations) else 0.0 for p in PCTS},
        hole_width_nodes=width,
        events_per_hour=float(len(ev_times) / hours) if hours > 0 else 0.0,
        intervals=len(durations),
    )


def plot_idle(masked: IdleIntervals, path: str, schedule: Schedule | None = None, title: str = "") -> None:
    """Idle nodes over time, outages shaded, and jobs waiting on a second axis when known."""
    with optional_imports():
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    times, counts = masked.idle_count()
    t0 = masked.t0
    hours = lambda t: (np.asarray(t) - t0) / 3600.0  # noqa: E731
    unit, scale = ("days", 24.0) if masked.span > 4 * 86400 else ("hours", 1.0)
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.step(hours(np.append(times, masked.t1)) / scale, np.append(counts, counts[-1] if len(counts) else 0),
            where="post", lw=0.6, color="tab:blue", label="idle nodes")
    for a, b in masked.masked or []:
        ax.axvspan(float(hours(a)) / scale, float(hours(b)) / scale, color="0.85", lw=0, label="_outage")
    ax.set_xlabel(f"{unit} since start")
    ax.set_ylabel("idle nodes")
    ax.set_ylim(0, masked.n_nodes)
    if schedule is not None:
        wt, wc = schedule.waiting_count()
        sel = (wt >= masked.t0) & (wt <= masked.t1)
        ax2 = ax.twinx()
        ax2.step(hours(wt[sel]) / scale, wc[sel], where="post", lw=0.5, color="tab:red", alpha=0.6)
        ax2.set_ylabel("jobs waiting", color="tab:red")
    ax.set_title(title or "idle nodes over time (grey: masked outages)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
