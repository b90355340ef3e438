"""FCFS + EASY backfill replay of an SWF trace.

Jobs queue in submit order. The head starts as soon as it fits; when it does not, it gets a reservation at
the earliest time enough nodes free up (by the running jobs' estimated ends), and later jobs may start now
only if they fit and either end (by their estimate) before that time or use only nodes the head will not need.
Estimates are max(requested, actual run time), so jobs never outrun them and the head never starts later than
its first reservation.

Speed (448k RICC jobs in seconds): the queue and the running jobs' estimated ends are numpy arrays; a backfill
pass pre-filters candidates in numpy; an event with arrivals only examines just the new jobs, since nothing
that was rejected before can fit now (free nodes, spare nodes and the time left before the reservation only
shrink until a job ends).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from .swf import Schedule, SwfTrace


def easy_schedule(trace: SwfTrace, *, backfill_depth: int | None = 500,
                  progress: Callable[[int], object] | None = None) -> Schedule:
    """Replay ``trace`` on its capacity. ``backfill_depth`` caps how many queued jobs one backfill pass
    examines, like Slurm's bf_max_job_test (default 500 there too); None = all.
    ``progress(jobs_submitted)`` is called now and then."""
    r = _Replay(trace, backfill_depth)
    n = r.n
    tick = 0
    while r.next_arrival < n or r.ends:
        t = min(r.submit[r.next_arrival] if r.next_arrival < n else np.inf, r.ends[0][0] if r.ends else np.inf)
        completed, first_new = r.arrive(t)
        if progress is not None and r.next_arrival >= tick:
            progress(r.next_arrival)
            tick = r.next_arrival + 4096
        r.schedule(t, completed, first_new)
    if progress is not None:
        progress(n)
    return Schedule(trace.capacity, trace.submit.copy(), r.start, r.start + trace.run, trace.size.copy(),
                    "easy", trace.cores_per_node, r.reservation,
                    reservation_timeline=(np.array(r.res_t), np.array(r.res_v)))   # what it knew, when (predict.py)


class _Replay:
    """One replay's state: the queue (job ids, submit order), the running jobs sorted by estimated end and the
    head's reservation (``shadow``: when it may start; ``extra``: nodes it will not need then)."""

    def __init__(self, trace: SwfTrace, backfill_depth: int | None) -> None:
        n = self.n = len(trace)
        self.submit = trace.submit.tolist()
        self.run = trace.run.tolist()
        self.size_a = trace.size.astype(np.int64)
        self.est_a = trace.estimate.astype(float)
        self.size = self.size_a.tolist()
        cap = trace.capacity
        self.start = np.full(n, np.nan)
        self.reservation = np.full(n, np.nan)
        self.free = cap
        self.queue = np.empty(0, dtype=np.int64)
        self.ends: list[tuple[float, int]] = []           # heap of (actual end, job)
        # running jobs sorted by estimated end: r_end[:m], their sizes and ids (at most `cap` run at once)
        self.r_end = np.empty(cap + 1)
        self.r_size = np.empty(cap + 1, dtype=np.int64)
        self.r_job = np.empty(cap + 1, dtype=np.int64)
        self.m = 0
        self.next_arrival = 0
        self.depth = backfill_depth or n
        self.shadow, self.extra = np.inf, 0
        self.res_t: list[float] = []                      # the reservation timeline: from res_t[i], the head's
        self.res_v: list[float] = []                      # planned start is res_v[i] (inf: no job waits)

    def note(self, t: float, v: float) -> None:
        """The head's planned start is ``v`` from ``t`` on."""
        res_t, res_v = self.res_t, self.res_v
        if res_t and res_t[-1] == t:
            res_v[-1] = v
        elif not res_v or res_v[-1] != v:
            res_t.append(t)
            res_v.append(v)

    def launch(self, j: int, t: float) -> None:
        """Start job ``j`` at ``t``."""
        self.start[j] = t
        self.free -= self.size[j]
        heapq.heappush(self.ends, (t + self.run[j], j))
        e = t + self.est_a[j]
        m = self.m
        pos = int(np.searchsorted(self.r_end[:m], e, side="right"))
        for arr, v in ((self.r_end, e), (self.r_size, self.size[j]), (self.r_job, j)):
            arr[pos + 1:m + 1] = arr[pos:m]
            arr[pos] = v
        self.m = m + 1

    def finish(self, j: int) -> None:
        """Job ``j`` ended: its nodes are free."""
        self.free += self.size[j]
        m = self.m
        pos = int(np.searchsorted(self.r_end[:m], self.start[j] + self.est_a[j], side="left"))
        while self.r_job[pos] != j:
            pos += 1
        for arr in (self.r_end, self.r_size, self.r_job):
            arr[pos:m - 1] = arr[pos + 1:m]
        self.m = m - 1

    def arrive(self, t: float) -> tuple[bool, int]:
        """End the jobs due by ``t`` and queue the ones submitted by then: whether any ended, and where in the
        queue the new ones begin."""
        completed = False
        ends = self.ends
        while ends and ends[0][0] <= t:
            self.finish(heapq.heappop(ends)[1])
            completed = True
        first_new = len(self.queue)
        a = self.next_arrival
        while self.next_arrival < self.n and self.submit[self.next_arrival] <= t:
            self.next_arrival += 1
        if self.next_arrival > a:
            self.queue = np.concatenate([self.queue, np.arange(a, self.next_arrival)])
        return completed, first_new

    def schedule(self, t: float, completed: bool, first_new: int) -> None:
        """Start the queue's head while it fits, reserve for the head that does not, then backfill."""
        queue, size = self.queue, self.size
        if not len(queue):
            self.note(t, np.inf)
            return
        h = 0
        while h < len(queue) and size[queue[h]] <= self.free:
            self.launch(int(queue[h]), t)
            h += 1
        if h:
            queue = self.queue = queue[h:]
            first_new = 0
        if not len(queue):
            self.note(t, np.inf)
            return
        head = int(queue[0])
        if completed or first_new == 0 or np.isnan(self.reservation[head]):
            self.reserve(head, t)
            lo = 1
        else:
            lo = max(1, first_new)
        hi = min(len(queue), self.depth + 1)
        if self.free == 0 or lo >= hi:
            return
        started = self.backfill(np.arange(lo, hi), t)
        if len(started):
            self.queue = np.delete(queue, started)

    def reserve(self, head: int, t: float) -> None:
        """The head's reservation: the earliest estimated end by which enough nodes are free for it."""
        m, free = self.m, self.free
        need = self.size[head] - free
        cum = np.cumsum(self.r_size[:m])
        i = int(np.searchsorted(cum, need))
        if i < m:
            self.shadow = float(self.r_end[i])
            # every job ending by the shadow time frees its nodes, ties included
            self.extra = free + int(cum[np.searchsorted(self.r_end[:m], self.shadow, side="right") - 1]) \
                - self.size[head]
        else:
            self.shadow, self.extra = np.inf, 0
        if np.isnan(self.reservation[head]):
            self.reservation[head] = self.shadow
        self.note(t, self.shadow)

    def backfill(self, window: np.ndarray, t: float) -> np.ndarray:
        """Start what fits in ``window`` (positions in queue); return the positions started."""
        q = self.queue[window]
        ws, we = self.size_a[q], self.est_a[q]
        shadow = self.shadow
        cand = np.flatnonzero((ws <= self.free) & ((t + we <= shadow) | (ws <= self.extra)))
        started = []
        for c in cand.tolist():
            k = int(ws[c])
            if k > self.free:
                continue
            if t + we[c] <= shadow:
                self.launch(int(q[c]), t)
            elif k <= self.extra:
                self.extra -= k
                self.launch(int(q[c]), t)
            else:
                continue
            started.append(window[c])
            if self.free == 0:
                break
        return np.array(started, dtype=np.int64)
