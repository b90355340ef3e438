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

import numpy as np

from .swf import Schedule, SwfTrace


def easy_schedule(trace: SwfTrace, *, backfill_depth: int | None = 500, progress=None) -> Schedule:
    """Replay ``trace`` on its capacity. ``backfill_depth`` caps how many queued jobs one backfill pass
    examines, like Slurm's bf_max_job_test (default 500 there too); None = all.
    ``progress(jobs_submitted)`` is called now and then."""
    n = len(trace)
    submit = trace.submit.tolist()
    run = trace.run.tolist()
    size_a = trace.size.astype(np.int64)
    est_a = trace.estimate.astype(float)
    size = size_a.tolist()
    cap = trace.capacity
    start = np.full(n, np.nan)
    reservation = np.full(n, np.nan)
    free = cap
    queue = np.empty(0, dtype=np.int64)
    ends: list[tuple[float, int]] = []           # heap of (actual end, job)
    # running jobs sorted by estimated end: r_end[:m], their sizes and ids (at most `cap` run at once)
    r_end = np.empty(cap + 1)
    r_size = np.empty(cap + 1, dtype=np.int64)
    r_job = np.empty(cap + 1, dtype=np.int64)
    m = 0
    next_arrival = 0
    depth = backfill_depth or n
    shadow, extra = np.inf, 0
    res_t: list[float] = []                      # the reservation timeline: from res_t[i], the head's planned
    res_v: list[float] = []                      # start is res_v[i] (inf: no job waits)

    def note(t: float, v: float) -> None:
        if res_t and res_t[-1] == t:
            res_v[-1] = v
        elif not res_v or res_v[-1] != v:
            res_t.append(t)
            res_v.append(v)

    def launch(j: int, t: float) -> None:
        nonlocal free, m
        start[j] = t
        free -= size[j]
        heapq.heappush(ends, (t + run[j], j))
        e = t + est_a[j]
        pos = int(np.searchsorted(r_end[:m], e, side="right"))
        for arr, v in ((r_end, e), (r_size, size[j]), (r_job, j)):
            arr[pos + 1:m + 1] = arr[pos:m]
            arr[pos] = v
        m += 1

    def finish(j: int) -> None:
        nonlocal free, m
        free += size[j]
        pos = int(np.searchsorted(r_end[:m], start[j] + est_a[j], side="left"))
        while r_job[pos] != j:
            pos += 1
        for arr in (r_end, r_size, r_job):
            arr[pos:m - 1] = arr[pos + 1:m]
        m -= 1

    def backfill(window: np.ndarray, t: float) -> np.ndarray:
        """Start what fits in ``window`` (positions in queue); return the positions started."""
        nonlocal extra
        q = queue[window]
        ws, we = size_a[q], est_a[q]
        cand = np.flatnonzero((ws <= free) & ((t + we <= shadow) | (ws <= extra)))
        started = []
        for c in cand.tolist():
            k = int(ws[c])
            if k > free:
                continue
            if t + we[c] <= shadow:
                launch(int(q[c]), t)
            elif k <= extra:
                extra -= k
                launch(int(q[c]), t)
            else:
                continue
            started.append(window[c])
            if free == 0:
                break
        return np.array(started, dtype=np.int64)

    tick = 0
    while next_arrival < n or ends:
        t = min(submit[next_arrival] if next_arrival < n else np.inf, ends[0][0] if ends else np.inf)
        completed = False
        while ends and ends[0][0] <= t:
            finish(heapq.heappop(ends)[1])
            completed = True
        first_new = len(queue)
        a = next_arrival
        while next_arrival < n and submit[next_arrival] <= t:
            next_arrival += 1
        if next_arrival > a:
            queue = np.concatenate([queue, np.arange(a, next_arrival)])
        if progress is not None and next_arrival >= tick:
            progress(next_arrival)
            tick = next_arrival + 4096
        if not len(queue):
            note(t, np.inf)
            continue
        h = 0
        while h < len(queue) and size[queue[h]] <= free:
            launch(int(queue[h]), t)
            h += 1
        if h:
            queue = queue[h:]
            first_new = 0
        if not len(queue):
            note(t, np.inf)
            continue
        head = int(queue[0])
        full_pass = completed or first_new == 0 or np.isnan(reservation[head])
        if full_pass:
            # reservation: the earliest estimated end by which enough nodes are free for the head
            need = size[head] - free
            cum = np.cumsum(r_size[:m])
            i = int(np.searchsorted(cum, need))
            if i < m:
                shadow = float(r_end[i])
                # every job ending by the shadow time frees its nodes, ties included
                extra = free + int(cum[np.searchsorted(r_end[:m], shadow, side="right") - 1]) - size[head]
            else:
                shadow, extra = np.inf, 0
            if np.isnan(reservation[head]):
                reservation[head] = shadow
            note(t, shadow)
            lo = 1
        else:
            lo = max(1, first_new)
        hi = min(len(queue), depth + 1)
        if free == 0 or lo >= hi:
            continue
        started = backfill(np.arange(lo, hi), t)
        if len(started):
            queue = np.delete(queue, started)
    if progress is not None:
        progress(n)
    out = Schedule(cap, trace.submit.copy(), start, start + trace.run, trace.size.copy(), "easy",
                   trace.cores_per_node, reservation)
    out.reservation_timeline = (np.array(res_t), np.array(res_v))   # what the scheduler knew, when (predict.py)
    return out
