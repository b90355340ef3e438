"""Nodes that joined but are not ready for a fragment yet: a new pilot's worker starts its rank forkserver (torch
imported) in seconds, tens of seconds from a parallel file system. Planned at once, such a node would make the
job it is added to stop its running fragment and wait, on all its other nodes, for that import. So a node
enters the plan once its worker reports warm (``FragmentRunner.prime``), or after ``wait_s`` at the latest; the
job's fragment trains on meanwhile. Once the last warming node is ready, none is about to come (``drained``):
the orchestrator plans at once instead of waiting for more joins. Owner: the orchestrator's loop."""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..nodes import local_name, node_id, site_of
from .fragments import FragmentRunner

WARM_WAIT_S = 30.0      # a node whose worker never says it is warm is planned after this long anyway


@dataclass
class _Site:
    cold: dict[str, tuple[float, float]] = field(default_factory=dict)   # node id -> (until, deadline)
    pending: list[Future[str]] = field(default_factory=list)             # warm-ups sent, not yet answered


class WarmingNodes:
    """Joined nodes waiting for their worker's warm-up. A warm-up is a task of the node's executor, and a lane
    with several pilots may run it on another (idle, already warm) worker: it is then sent again, until every
    cold node has answered or waited ``wait_s``."""

    def __init__(self, runners: Mapping[str, FragmentRunner], wait_s: float = WARM_WAIT_S) -> None:
        self._runners, self.wait_s = runners, wait_s
        self._sites: dict[str, _Site] = {}
        self._ready: list[tuple[str, float]] = []
        self.drained = False    # the last nodes ready had warmed up and no other is warming: none is about to come

    def __contains__(self, node: str) -> bool:
        return any(node in s.cold for s in self._sites.values())

    def add(self, nodes: Sequence[str], until: Sequence[float], now: float) -> None:
        """Nodes just joined (``until``: when each is expected to leave; none given: no known end). Those of
        sites whose workers need no warm-up are ready at the next ``warmed``."""
        ends = list(until) or [math.inf] * len(nodes)
        for site in dict.fromkeys(site_of(n) for n in nodes):
            mine = [(n, u) for n, u in zip(nodes, ends) if site_of(n) == site]
            futs = self._runners[site].prime([local_name(n) for n, _ in mine])
            if futs:
                s = self._sites.setdefault(site, _Site())
                s.cold.update({n: (u, now + self.wait_s) for n, u in mine})
                s.pending += futs
            else:
                self._ready += mine

    def drop(self, nodes: Sequence[str]) -> None:
        """Nodes that left (or got their notice) before they were warm."""
        for s in self._sites.values():
            for n in nodes:
                s.cold.pop(n, None)
        self._ready = [(n, u) for n, u in self._ready if n not in nodes]

    def take(self, nodes: Collection[str]) -> list[tuple[str, float]]:
        """Nodes a fragment's rank already runs on, as (node id, until): ready now, whatever their warm-up says
        (it waits behind that rank on the node's one worker)."""
        return [(n, s.cold.pop(n)[0]) for s in self._sites.values() for n in nodes if n in s.cold]

    def warmed(self, now: float) -> list[tuple[str, float]]:
        """The nodes ready now, as (node id, until): their worker answered, or they waited ``wait_s``."""
        ready, self._ready = self._ready, []
        no_warm_up = len(ready)
        for site, s in self._sites.items():
            answered = [f.result() for f in s.pending if f.done() and f.exception() is None]
            s.pending = [f for f in s.pending if not f.done()]
            for n in (node_id(site, name) for name in answered):
                if n in s.cold:
                    ready.append((n, s.cold.pop(n)[0]))
            ready += [(n, s.cold.pop(n)[0]) for n, (_, dl) in list(s.cold.items()) if now >= dl]
            if s.cold and not s.pending and answered:    # it ran on a warm worker: once more for the cold ones
                s.pending = self._runners[site].prime([local_name(n) for n in s.cold])
        if ready:
            self.drained = len(ready) > no_warm_up and not any(s.cold for s in self._sites.values())
        return ready
