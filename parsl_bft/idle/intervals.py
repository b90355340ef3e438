"""Idle capacity as per-node idle intervals: the one representation every source produces.

From intervals come the event stream the planner consumes (time, nodes that became idle, nodes reclaimed),
the remaining idle time of each node (horizon awareness), statistics and plots.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from ..csvio import csv_reader, open_text
from ..errors import BadRows, BadValue, InputError

INTERVAL_COLUMNS = ["node", "idle_start", "idle_end"]
MAX_TIME = 1e12                 # unix seconds (year 33658): a larger or non-finite time is a damaged row


@dataclass(frozen=True)
class IdleEvent:
    """At ``time``: ``joined`` nodes became idle (each idle until ``joined_until``, inf if unknown),
    ``left`` nodes were reclaimed by the facility's scheduler."""

    time: float
    joined: tuple[str, ...]
    left: tuple[str, ...]
    joined_until: tuple[float, ...] = ()


def step_count(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How many of the intervals [starts[i], ends[i]) are open: (times, count from times[k] to times[k+1])."""
    t = np.concatenate([starts, ends])
    d = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    times, idx = np.unique(t, return_index=True)
    return times, (np.cumsum(np.add.reduceat(d, idx)) if len(t) else np.zeros(0))


@dataclass
class IdleIntervals:
    """Per-node idle intervals over an observation span [t0, t1).

    node[i] indexes ``names``; intervals of one node never overlap (touching ones are merged).
    """

    names: list[str]
    node: np.ndarray
    start: np.ndarray
    end: np.ndarray
    t0: float
    t1: float
    source: str = ""
    masked: list[tuple[float, float]] | None = None  # outage periods removed (see mask_outages)

    @property
    def n_nodes(self) -> int:
        """Nodes observed (idle at least once)."""
        return len(self.names)

    @property
    def span(self) -> float:
        """Seconds observed."""
        return self.t1 - self.t0

    @classmethod
    def build(cls, names: list[str], node: ArrayLike, start: ArrayLike, end: ArrayLike, t0: float | None = None,
              t1: float | None = None, source: str = "") -> IdleIntervals:
        """Intervals from unsorted per-row arrays: empty ones dropped, touching ones of a node merged, the span
        [t0, t1) from the data unless given."""
        node = np.asarray(node, dtype=np.int64)
        start = np.asarray(start, dtype=float)
        end = np.asarray(end, dtype=float)
        keep = end > start
        node, start, end = node[keep], start[keep], end[keep]
        order = np.lexsort((start, node))
        node, start, end = node[order], start[order], end[order]
        node, start, end = _merge_touching(node, start, end)
        if t0 is None:
            t0 = float(start.min()) if len(start) else 0.0
        if t1 is None:
            t1 = float(end.max()) if len(end) else t0
        return cls(names, node, start, end, float(t0), float(t1), source)

    # --- selections -------------------------------------------------------------------------
    def window(self, t_start: float | None, t_end: float | None) -> IdleIntervals:
        """Clip to [t_start, t_end)."""
        a = self.t0 if t_start is None else max(self.t0, t_start)
        b = self.t1 if t_end is None else min(self.t1, t_end)
        if b <= a:
            raise BadValue(f"empty window: the data spans {self.t0:.0f}..{self.t1:.0f}, asked {t_start}..{t_end}")
        s = np.clip(self.start, a, b)
        e = np.clip(self.end, a, b)
        out = IdleIntervals.build(self.names, self.node, s, e, a, b, self.source)
        out.masked = [(max(x, a), min(y, b)) for x, y in (self.masked or []) if y > a and x < b]
        return out

    def first_nodes(self, n: int) -> IdleIntervals:
        """Keep the first n nodes (``names`` is in order of first appearance)."""
        if n < 1:
            raise BadValue(f"--nodes must be >= 1, got {n}")
        n = min(n, self.n_nodes)
        keep = self.node < n
        out = IdleIntervals(self.names[:n], self.node[keep], self.start[keep], self.end[keep], self.t0, self.t1,
                            self.source, self.masked)
        return out

    # --- derived views ----------------------------------------------------------------------
    def idle_count(self) -> tuple[np.ndarray, np.ndarray]:
        """Step function of idle nodes: (times, count from times[i] to times[i+1])."""
        return step_count(self.start, self.end)

    def idle_node_seconds(self) -> float:
        """Node-seconds idle over the span."""
        return float(np.sum(self.end - self.start))

    def events(self) -> Iterator[IdleEvent]:
        """The event stream, in time order; at one instant reclaims and joins come together."""
        n = len(self.start)
        if n == 0:
            return
        times = np.concatenate([self.start, self.end])
        kind = np.concatenate([np.ones(n, dtype=np.int8), np.zeros(n, dtype=np.int8)])  # 1 join, 0 leave
        idx = np.concatenate([np.arange(n), np.arange(n)])
        order = np.lexsort((kind, times))
        times, kind, idx = times[order], kind[order], idx[order]
        # an interval reaching the end of the span is not a reclaim: the observation just stops
        real = ~((kind == 0) & (times >= self.t1))
        times, kind, idx = times[real], kind[real], idx[real]
        bounds = np.flatnonzero(np.diff(times)) + 1
        names = self.names
        node, end = self.node, self.end
        for group in np.split(np.arange(len(times)), bounds):
            k = kind[group]
            ii = idx[group]
            j = ii[k == 1]
            lv = ii[k == 0]
            yield IdleEvent(float(times[group[0]]),
                            tuple(names[x] for x in node[j]),
                            tuple(names[x] for x in node[lv]),
                            tuple(end[j].tolist()))


def _merge_touching(node: np.ndarray, start: np.ndarray,
                    end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge overlapping or touching intervals of the same node (input sorted by node, start).

    Vectorised: shifting each node's times by node * (span + 1) turns "running max of end within a node"
    into one global running max.
    """
    if len(node) < 2:
        return node, start, end
    t_min = float(start.min())
    width = float(end.max()) - t_min + 1.0
    cm = np.maximum.accumulate(end - t_min + node * width)
    new = np.r_[True, (start[1:] - t_min + node[1:] * width) > cm[:-1]]
    idx = np.flatnonzero(new)
    return node[idx], start[idx], np.maximum.reduceat(end, idx)


def read_idle_intervals(path: str | Path, *, lenient: bool = False) -> IdleIntervals:
    """Read ``node,idle_start,idle_end[,...]`` (unix seconds, optionally gzipped).

    Node order is the order of first appearance in the file (used by ``--nodes N``).
    """
    p = str(path)
    bad = BadRows(lenient)
    index: dict[str, int] = {}
    nodes: list[int] = []
    starts: list[float] = []
    ends: list[float] = []
    with open_text(path) as fh:
        reader = csv_reader(fh, path)
        cols = _columns(reader, p)
        for row in reader:
            if not row:
                continue
            got = _interval(row, reader.line_num, cols, p, bad)
            if got is None:
                continue
            name, s, e = got
            k = index.get(name)
            if k is None:
                k = index[name] = len(index)
            nodes.append(k)
            starts.append(s)
            ends.append(e)
    bad.warn()
    if not nodes:
        raise InputError(p, 0, None, "no idle intervals in file")
    if not any(e > s for s, e in zip(starts, ends)):
        raise InputError(p, 0, "idle_end", "every interval has zero length (idle_end == idle_start): no idle time")
    return IdleIntervals.build(list(index), nodes, starts, ends, source=p)


def _columns(reader: csv_reader, p: str) -> tuple[int, int, int, int]:
    """From the header: the node, idle_start and idle_end columns, and how many fields a row has."""
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError(p, 1, None, "empty file: expected header node,idle_start,idle_end") from None
    missing = [c for c in INTERVAL_COLUMNS if c not in header]
    if missing:
        raise InputError(p, 1, missing[0], f"missing column(s) {', '.join(missing)}; header is {','.join(header)}")
    ci, cs, ce = (header.index(c) for c in INTERVAL_COLUMNS)
    return ci, cs, ce, len(header)


def _interval(row: list[str], line: int, cols: tuple[int, int, int, int], p: str,
              bad: BadRows) -> tuple[str, float, float] | None:
    """One row's (node, start, end), or None with the damage recorded in ``bad``."""
    ci, cs, ce, width = cols
    try:
        if len(row) != width:
            raise InputError(p, line, None, f"expected {width} fields, found {len(row)}")
        s = float(row[cs])
        e = float(row[ce])
    except ValueError:
        for c, f in ((cs, "idle_start"), (ce, "idle_end")):
            try:
                float(row[c])
            except ValueError:
                bad.add(InputError(p, line, f, f"not a number: {row[c]!r}"))
                break
        return None
    except InputError as err:
        bad.add(err)
        return None
    if not (abs(s) <= MAX_TIME and abs(e) <= MAX_TIME):      # NaN, inf, absurd
        f, t = ("idle_start", row[cs]) if not abs(s) <= MAX_TIME else ("idle_end", row[ce])
        bad.add(InputError(p, line, f, f"not a finite time of at most {MAX_TIME:g} s: {t!r}"))
        return None
    if not e >= s:
        bad.add(InputError(p, line, "idle_end", f"idle_end {row[ce]} is before idle_start {row[cs]}"))
        return None
    name = row[ci].strip()
    if not name:
        bad.add(InputError(p, line, "node", "empty node name"))
        return None
    return name, s, e
