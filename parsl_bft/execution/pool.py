"""Live idle-capacity sources for the runtime: pilot jobs on a batch system (``PilotPool``, in
``pilot_pool``), or (the embedded default) an emulated pool on the local machine.

``EmulatedPool`` replays idle intervals (a real trace slice, or a pattern) in wall-clock time, ``speedup`` times
faster. Before every reclaim it sends a notice (``notice_s`` wall seconds ahead, as Slurm's --signal does), then
the node is gone. The orchestrator turns notices into "checkpoint now" requests and kills what still runs on a
node when it leaves.
"""
from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadValue
from ..idle.intervals import IdleIntervals, read_idle_intervals
from ..topology import Topology
from .pilot_pool import PilotPool
from .pilot_records import PilotState, hold_block
from .protocols import IdlePool, NoticeReason, PoolEvent, PoolEventKind

__all__ = ["DEMO_TRACE", "EmulatedPool", "IdlePool", "MultiPool", "NoticeReason", "PilotPool", "PilotState",
           "PoolEvent", "PoolEventKind", "SitePool", "hold_block"]

logger = logging.getLogger(__name__)
DEMO_TRACE = Path(__file__).resolve().parent.parent / "data" / "demo_idle_intervals.csv"


class EmulatedPool:
    """Idle intervals replayed on this machine, ``speedup`` times faster than the trace; ``repeat``: the trace
    again and again (every node still idle at its end leaves then)."""

    gang: bool = False             # a fragment's ranks all run in one task on this machine
    demand: int | None = None   # the emulated nodes come and go by the trace, whatever the jobs need
    in_use: set[str] | None = None
    stop_s: float | None = None    # the trace says when nodes leave; their notice is the trace's
    topology: Topology | None = None   # one machine: no network groups

    def __init__(self, intervals: IdleIntervals, *, speedup: float = 30.0, notice_s: float = 3.0,
                 repeat: bool = False, clock: Callable[[], float] = time.monotonic):
        if speedup <= 0:
            raise BadValue(f"speedup must be > 0, got {speedup}")
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
                self._push(max(w - self.notice_s, off), 1, PoolEvent(PoolEventKind.NOTICE, ev.left, w))
                self._push(w, 0, PoolEvent(PoolEventKind.LEAVE, ev.left, w))
                idle -= set(ev.left)
            if ev.joined:
                until = tuple(off + (u - t0) / self.speedup for u in ev.joined_until)
                self._push(w, 2, PoolEvent(PoolEventKind.JOIN, ev.joined, w, until))
                idle |= set(ev.joined)
        if self.repeat and idle:
            end = off + self.duration
            left = tuple(sorted(idle))
            self._push(max(end - self.notice_s, off), 1, PoolEvent(PoolEventKind.NOTICE, left, end))
            self._push(end, 0, PoolEvent(PoolEventKind.LEAVE, left, end))
        self._cycle += 1

    @classmethod
    def demo(cls, **kw: Any) -> EmulatedPool:
        """The shipped demo trace (``DEMO_TRACE``)."""
        return cls(read_idle_intervals(DEMO_TRACE), **kw)

    @classmethod
    def pattern(cls, nodes: int, period_s: float, cycles: int, **kw: Any) -> EmulatedPool:
        """A synthetic square wave: node i is idle for the first (i+1)/(nodes+1) of every period."""
        names = [f"node{i}" for i in range(nodes)]
        node: list[int] = []
        start: list[float] = []
        end: list[float] = []
        for c in range(cycles):
            for i in range(nodes):
                node.append(i)
                start.append(c * period_s)
                end.append(c * period_s + period_s * (i + 1) / (nodes + 1))
        return cls(IdleIntervals.build(names, node, start, end, 0.0, cycles * period_s), **{"speedup": 1.0, **kw})

    def start(self) -> None:
        """Start the replay now."""
        self._origin = self.clock()

    def elapsed(self) -> float:
        """Wall seconds since ``start`` (0 before it)."""
        return 0.0 if self._origin is None else self.clock() - self._origin

    def poll(self) -> list[PoolEvent]:
        """Events due by now, in order (leave before join at the same instant)."""
        now = self.elapsed()
        if self.repeat and now >= (self._cycle - 1) * self.duration:
            self._load_cycle()
        out: list[PoolEvent] = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[3])
        return out

    def release(self, nodes: Collection[str]) -> None:
        """Nothing to give back early: the trace says when a node leaves."""

    def stop(self) -> None:
        """Nothing to give back: the emulated nodes are this machine."""

    def executor_label(self, node: str) -> str | None:
        """One executor runs every node: None."""
        return None

    @property
    def finished(self) -> bool:
        """The trace has been replayed to its end (never, when repeating)."""
        return not self.repeat and not self._heap and self.elapsed() >= self.duration


@dataclass
class SitePool:
    """One site of a run: its idle pool, the label of the Parsl executor that runs on it, where its checkpoints
    go (None: under the orchestrator's state directory) and how many ranks a fragment runs per node (the
    site's accelerators per node)."""

    pool: IdlePool
    executor: str
    checkpoint_dir: Path | None = None
    ranks_per_node: int = 1


class MultiPool:
    """Several sites' pools as one: node ids become ``site:node`` (what ``planner.multisite`` expects);
    the orchestrator runs each fragment through the executor of the site its nodes belong to."""

    def __init__(self, sites: dict[str, SitePool]):
        bad = [s for s in sites if not s or ":" in s]
        if bad or not sites:
            raise BadValue(f"site names must be non-empty and free of ':', got {list(sites) or 'none'}")
        self.sites = sites

    @property
    def gang(self) -> bool:
        """Does any site run a fragment's ranks one task a node?"""
        return any(s.pool.gang for s in self.sites.values())

    def start(self) -> None:
        """Start every site's pool."""
        for s in self.sites.values():
            s.pool.start()

    def poll(self) -> list[PoolEvent]:
        """Every site's events, its nodes named ``site:node`` (a notice's reason is not passed on)."""
        return [PoolEvent(e.kind, tuple(f"{name}:{n}" for n in e.nodes), e.wall, e.until)
                for name, s in self.sites.items() for e in s.pool.poll()]

    def release(self, nodes: Collection[str]) -> None:
        """Each site's pool releases its own of ``nodes``."""
        for name, s in self.sites.items():
            s.pool.release({n.split(":", 1)[1] for n in nodes if n.startswith(f"{name}:")})

    def stop(self) -> None:
        """Stop every site's pool."""
        for s in self.sites.values():
            s.pool.stop()
