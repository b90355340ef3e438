"""Concrete nodes for a Schedule's jobs, and every node's idle intervals.

Jobs take the nodes free longest; core-unit logs are packed onto nodes, and only completely free nodes count as
idle (training needs them).
"""
from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from ..errors import BadValue, InputError
from .intervals import IdleIntervals
from .schedule import Schedule


def assign_nodes(s: Schedule, *, t0: float | None = None, t1: float | None = None,
                 source: str = "", max_overflow: float = 0.001) -> IdleIntervals:
    """Give each job concrete nodes and return every node's idle intervals.

    Jobs take the nodes that have been free longest (FIFO), so idleness spreads over the machine as on a real
    one and any slice of N nodes (``--nodes N``) is a fair sample; lowest-id-first would make the first nodes
    almost never idle. Core logs pack jobs onto nodes: whole free nodes for whole multiples, the best-fitting
    partly used node for the rest, so that small jobs leave as many nodes completely free as they can. Span:
    first start .. last submit by default (after the last submit the queue only drains, which is not idle
    capacity anyone would have had).

    Recorded logs are sometimes a little inconsistent (theta_2022: 9 instants, 0.003% of the time, above
    capacity). A job that starts when too few nodes are free gets the free ones and the shortfall is counted;
    beyond ``max_overflow`` of the jobs the schedule is rejected (replay it with EASY instead).
    """
    if len(s.start) == 0:
        raise BadValue("empty schedule")
    t0 = float(s.start.min()) if t0 is None else t0
    t1 = float(s.submit.max()) if t1 is None else t1
    if t1 <= t0:
        t1 = float(s.end.max())
    pool = (_WholeNodePool if s.cores_per_node == 1 else _NodePool)
    alloc = pool(s.capacity // s.cores_per_node, s.cores_per_node, t0, source)
    starts, ends, sizes = s.start.tolist(), s.end.tolist(), s.size.tolist()
    held: dict[int, list[tuple[int, int]]] = {}
    # ends before starts at the same instant: a node freed at t can be taken at t
    times = np.concatenate([s.end, s.start])
    kinds = np.concatenate([np.zeros(len(s.end), np.int8), np.ones(len(s.start), np.int8)])
    jobs = np.concatenate([np.arange(len(s.end)), np.arange(len(s.start))])
    order = np.lexsort((kinds, times))
    overflows = 0
    for j, is_start in zip(jobs[order].tolist(), kinds[order].tolist()):
        if is_start:
            want = sizes[j]
            got = min(want, alloc.free_total)
            if got < want:
                overflows += 1
                if overflows > max(1, max_overflow * len(sizes)):
                    raise InputError(source, 0, None,
                                     f"schedule exceeds capacity at t={starts[j]:.0f} (a job needs {want}, "
                                     f"{alloc.free_total} free) and at {overflows - 1} earlier starts: the recorded "
                                     "starts are inconsistent - use --schedule easy")
            held[j] = alloc.take(got, starts[j])
        elif j in held:
            alloc.give(held.pop(j), ends[j])
    if overflows:
        import warnings
        warnings.warn(f"{source}: {overflows} recorded job starts exceeded capacity; those jobs were placed on the "
                      "nodes that were free", stacklevel=2)
    return alloc.intervals(t0, t1)


class _NodePool:
    """Free cores per node; records a node's idle interval whenever it is completely free."""

    def __init__(self, n_nodes: int, cpn: int, t0: float, source: str) -> None:
        self.cpn = cpn
        self.free = [cpn] * n_nodes
        self.full = deque(range(n_nodes))           # completely free nodes, longest free first
        self.partial: list[list[int]] = [[] for _ in range(cpn)]     # heaps of partly used nodes, by free cores (lazy)
        self.idle_since = [t0] * n_nodes
        self.free_total = n_nodes * cpn
        self.source = source
        self.out: tuple[list[int], list[float], list[float]] = ([], [], [])

    def _occupy(self, k: int, t: float) -> None:
        if t > self.idle_since[k]:
            self.out[0].append(k)
            self.out[1].append(self.idle_since[k])
            self.out[2].append(t)
        self.idle_since[k] = math.inf

    def _pop_partial(self, f: int) -> int | None:
        h = self.partial[f]
        while h:
            k = heapq.heappop(h)
            if self.free[k] == f:
                return k
        return None

    def take(self, c: int, t: float) -> list[tuple[int, int]]:
        """Give a job ``c`` cores at ``t``: whole free nodes first, then the best-fitting partly used ones."""
        self.free_total -= c
        cpn, got = self.cpn, []
        while c >= cpn and self.full:
            k = self.full.popleft()
            self._occupy(k, t)
            self.free[k] = 0
            got.append((k, cpn))
            c -= cpn
        while c > 0:
            node: int | None = None
            for f in range(c, cpn):                  # best fit among partly used nodes
                node = self._pop_partial(f)
                if node is not None:
                    break
            if node is None and self.full:
                node = self.full.popleft()
                self._occupy(node, t)
            if node is None:                         # fragmented: spill over the fullest partial nodes
                for f in range(cpn - 1, 0, -1):
                    node = self._pop_partial(f)
                    if node is not None:
                        break
            assert node is not None, "free_total said enough cores were free"
            use = min(c, self.free[node])
            self.free[node] -= use
            c -= use
            got.append((node, use))
            if self.free[node] > 0:
                heapq.heappush(self.partial[self.free[node]], node)
        return got

    def give(self, held: list[tuple[int, int]], t: float) -> None:
        """Take back what ``take`` gave a job, at ``t`` (a node completely free from then on is idle)."""
        for k, c in held:
            self.free[k] += c
            self.free_total += c
            if self.free[k] == self.cpn:
                self.idle_since[k] = t
                self.full.append(k)
            else:
                heapq.heappush(self.partial[self.free[k]], k)

    def intervals(self, t0: float, t1: float) -> IdleIntervals:
        """Every node's idle intervals in ``t0``..``t1`` (nodes still idle at the end are idle until ``t1``)."""
        node, start, end = self.out
        for k, since in enumerate(self.idle_since):
            if since < t1:
                node.append(k)
                start.append(since)
                end.append(t1)
        width = len(str(len(self.free) - 1))
        names = [f"n{k:0{width}d}" for k in range(len(self.free))]
        return IdleIntervals.build(names, node, start, end, t0, t1, self.source).window(t0, t1)


class _WholeNodePool(_NodePool):
    """Whole-node allocation, vectorised: each job takes the nodes free longest."""

    def __init__(self, n_nodes: int, cpn: int, t0: float, source: str) -> None:
        super().__init__(n_nodes, 1, t0, source)
        self.pool = np.arange(n_nodes)
        self.since = np.full(n_nodes, t0)
        self.chunks: list[tuple[np.ndarray, np.ndarray, float]] = []

    def take(self, c: int, t: float) -> np.ndarray:  # type: ignore[override]
        """The ``c`` nodes free longest, as an array of node numbers."""
        self.free_total -= c
        got, self.pool = self.pool[:c], self.pool[c:]
        was = self.since[got]
        hit = t > was
        self.chunks.append((got[hit], was[hit], t))
        self.since[got] = np.inf
        return got

    def give(self, held: np.ndarray, t: float) -> None:  # type: ignore[override]
        """Take back the nodes ``take`` gave a job, at ``t``."""
        self.free_total += len(held)
        self.since[held] = t
        self.pool = np.concatenate([self.pool, held])

    def intervals(self, t0: float, t1: float) -> IdleIntervals:
        """As the core pool's, from the recorded chunks."""
        node, start, end = self.out
        for got, was, t in self.chunks:
            node.extend(got.tolist())
            start.extend(was.tolist())
            end.extend([t] * len(got))
        self.idle_since = self.since.tolist()
        return super().intervals(t0, t1)
