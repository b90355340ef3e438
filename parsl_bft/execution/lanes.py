"""Pilots per network group, so that a fragment's ranks land in the groups the plan chose.

HTEX sends a task to whichever connected worker pool is free: it cannot be aimed at a node. What Parsl can aim
at is an executor (``python_app(..., executors=[label])``). So a pilot pool that knows the network's groups
(racks, leaf switches) keeps one HTEX executor - a *lane* - per group it holds pilots in, all sharing its one
pilot provider (one scheduler survey serves them all), and submits each pilot to the lane of its group, aimed
at hole nodes of that group (``--nodelist``). A fragment's share planned on node n goes to the lane n is in:
its rank runs on a node of n's group (on n itself, unless another job's share of the same group took n first;
then the books follow, ``Controller.bind``). Lanes are made as groups get pilots, and a lane whose group has
no pilot left serves the next new group: one interchange per group in use, not per group of the machine.
"""
from __future__ import annotations

import signal
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, TypeVar

from parsl.executors.base import ParslExecutor

from ..topology import Topology, TopologyError
from .pilot import Hole

if TYPE_CHECKING:
    from .protocols import PilotExecutor

E = TypeVar("E", bound=ParslExecutor)


class Lanes:
    """group -> executor. The pool's own executor serves the first group; ``new_executor(label)`` makes (and
    starts) the others."""

    def __init__(self, base: PilotExecutor, topology: Topology, new_executor: Callable[[str], PilotExecutor]):
        self.base, self.topology, self._new = base, topology, new_executor
        self.executors: dict[str, PilotExecutor] = {}

    def group(self, node: str) -> str:
        """A node the topology does not know (added after it was read) is a group of its own."""
        try:
            return self.topology.group(node)
        except TopologyError:
            return node

    def executor(self, group: str, busy: Collection[str] = ()) -> PilotExecutor:
        """The lane of ``group``. A group new to the pool takes over the lane of a group with no pilot left
        (``busy``: the groups with pilots queued or running), so that a session whose holes wander over many
        racks keeps as many interchanges as groups it holds at once, not one per group it ever held."""
        if group not in self.executors:
            if self.base not in self.executors.values():
                self.executors[group] = self.base
            elif idle := next((g for g in self.executors if g not in busy), None):
                self.executors[group] = self.executors.pop(idle)
            else:
                self.executors[group] = self._new(f"{self.base.label}_lane{len(self.executors)}")
        return self.executors[group]

    def pilots(self, holes: list[Hole], want: int, per: int, max_pilots: int,
               held: set[str]) -> list[tuple[str, tuple[str, ...]]]:
        """(group, nodes) of the next pilots: ``want`` hole nodes, at most ``per`` a pilot and never two groups
        in one pilot, at most ``max_pilots`` pilots. Groups we hold nodes in first (our jobs grow there), then
        the groups with the most holes (compact); within a group the longest holes first."""
        by: dict[str, list[str]] = {}
        for h in sorted(holes, key=lambda h: -h.until):
            by.setdefault(self.group(h.node), []).append(h.node)
        out: list[tuple[str, tuple[str, ...]]] = []
        for g in sorted(by, key=lambda g: (g not in held, -len(by[g]), g)):
            nodes = by[g][:want]
            want -= len(nodes)
            for i in range(0, len(nodes), per):
                if len(out) == max_pilots:
                    return out
                out.append((g, tuple(nodes[i:i + per])))
            if want <= 0:
                break
        return out


def dfk_lane_factory(new_executor: Callable[[str], E]) -> Callable[[str], E]:
    """Lanes for a running DataFlowKernel: ``new_executor(label)`` builds an unstarted executor like the pool's
    own, with that label and the pool's provider (``SiteRuntime.pilot_executor``: from the site file, not a copy
    of the started one, which has rewritten its worker command and ports), and the DFK starts it (and polls its
    blocks, as any executor's). Its interchange starts with SIGINT blocked: a terminal's Ctrl-C reaches the whole
    process group, and a dead interchange hangs Parsl's cleanup (the session's own executors start with SIGINT
    ignored; lanes start in the orchestrator's thread, where only the mask can be set)."""
    def new(label: str) -> E:
        from parsl.dataflow.dflow import DataFlowKernelLoader

        ex = new_executor(label)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            DataFlowKernelLoader.dfk().add_executors([ex])
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return ex
    return new
