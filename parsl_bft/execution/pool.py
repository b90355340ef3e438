"""Live idle-capacity sources for the runtime. The embedded default: an emulated pool on the local machine.

``EmulatedPool`` replays idle intervals (a real trace slice, or a pattern) in wall-clock time, ``speedup`` times
faster. Before every reclaim it sends a notice (``notice_s`` wall seconds ahead, as Slurm's --signal does), then
the node is gone. The orchestrator turns notices into "checkpoint now" requests and kills what still runs on a
node when it leaves.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from pathlib import Path

from ..idle.intervals import IdleIntervals, read_idle_intervals

DEMO_TRACE = Path(__file__).resolve().parent.parent / "data" / "demo_idle_intervals.csv"


@dataclass(frozen=True)
class PoolEvent:
    kind: str                 # join | notice | leave
    nodes: tuple[str, ...]
    wall: float               # seconds since the pool started
    until: tuple[float, ...] = ()   # join: wall time each node is expected to leave


class EmulatedPool:
    def __init__(self, intervals: IdleIntervals, *, speedup: float = 30.0, notice_s: float = 3.0,
                 repeat: bool = False, clock=time.monotonic):
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.intervals, self.speedup, self.notice_s, self.clock = intervals, speedup, notice_s, clock
        self.repeat = repeat
        self.duration = intervals.span / speedup
        self._heap: list[tuple[float, int, int, PoolEvent]] = []
        self._seq = 0
        self._cycle = 0
        self._origin: float | None = None
        self._load_cycle()

    def _push(self, w: float, order: int, ev: PoolEvent) -> None:
        heapq.heappush(self._heap, (w, order, self._seq, ev))
        self._seq += 1

    def _load_cycle(self) -> None:
        """Queue one pass of the trace; when repeating, every node still idle at its end leaves then."""
        off = self._cycle * self.duration
        t0 = self.intervals.t0
        idle: set[str] = set()
        for ev in self.intervals.events():
            w = off + (ev.time - t0) / self.speedup
            if ev.left:
                self._push(max(w - self.notice_s, off), 1, PoolEvent("notice", ev.left, w))
                self._push(w, 0, PoolEvent("leave", ev.left, w))
                idle -= set(ev.left)
            if ev.joined:
                until = tuple(off + (u - t0) / self.speedup for u in ev.joined_until)
                self._push(w, 2, PoolEvent("join", ev.joined, w, until))
                idle |= set(ev.joined)
        if self.repeat and idle:
            end = off + self.duration
            left = tuple(sorted(idle))
            self._push(max(end - self.notice_s, off), 1, PoolEvent("notice", left, end))
            self._push(end, 0, PoolEvent("leave", left, end))
        self._cycle += 1

    @classmethod
    def demo(cls, **kw) -> "EmulatedPool":
        return cls(read_idle_intervals(DEMO_TRACE), **kw)

    @classmethod
    def pattern(cls, nodes: int, period_s: float, cycles: int, **kw) -> "EmulatedPool":
        """A synthetic square wave: node i is idle for the first (i+1)/(nodes+1) of every period."""
        names = [f"node{i}" for i in range(nodes)]
        node, start, end = [], [], []
        for c in range(cycles):
            for i in range(nodes):
                node.append(i)
                start.append(c * period_s)
                end.append(c * period_s + period_s * (i + 1) / (nodes + 1))
        return cls(IdleIntervals.build(names, node, start, end, 0.0, cycles * period_s), **{"speedup": 1.0, **kw})

    def start(self) -> None:
        self._origin = self.clock()

    def elapsed(self) -> float:
        return 0.0 if self._origin is None else self.clock() - self._origin

    def poll(self) -> list[PoolEvent]:
        """Events due by now, in order (leave before join at the same instant)."""
        now = self.elapsed()
        if self.repeat and now >= (self._cycle - 1) * self.duration:
            self._load_cycle()
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[3])
        return out

    @property
    def finished(self) -> bool:
        return not self.repeat and not self._heap and self.elapsed() >= self.duration
