"""Standard Workload Format job logs -> a node-level schedule -> idle intervals.

SWF (one job per line, 18 fields, ``;`` header comments) records submit, wait, run time and size but no node
ids. Start times come either from the log (``recorded``: start = submit + wait) or from an FCFS + EASY-backfill
replay of the same jobs (see easy.py). Node ids are then assigned deterministically (see assign_nodes).

Variants handled: extended SWF with extra trailing columns; the ALCF/Mira convention of the requested walltime
in field 6 (field 9 = -1) with rows not sorted by submit time; logs counted in cores (``units="cores"``) whose
jobs are scheduled on cores and packed onto nodes; only completely free nodes count as idle (training needs them).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..csvio import open_text
from ..errors import BadRows, InputError
from .intervals import IdleIntervals, step_count

# 1-based SWF field numbers
F_ID, F_SUBMIT, F_WAIT, F_RUN, F_ALLOC, F_AVGCPU, F_REQPROCS, F_REQTIME = 1, 2, 3, 4, 5, 6, 8, 9
FIELD_NAMES = {1: "job id", 2: "submit time", 3: "wait time", 4: "run time", 5: "allocated processors",
               6: "average cpu time", 8: "requested processors", 9: "requested time"}


@dataclass
class SwfTrace:
    """Jobs of an SWF log, sorted by submit time, sized in the log's units (nodes or cores)."""

    path: str
    capacity: int                 # in ``units``
    job_id: np.ndarray
    submit: np.ndarray
    wait: np.ndarray              # -1 = unknown
    run: np.ndarray
    size: np.ndarray              # in ``units``
    estimate: np.ndarray          # the scheduler's runtime estimate: max(requested, run)
    units: str = "nodes"
    cores_per_node: int = 1       # 1 when units == "nodes"
    variant: str = "standard"
    skipped: dict[str, int] = field(default_factory=dict)   # rows ignored on purpose, by reason

    def __len__(self) -> int:
        return len(self.submit)


@dataclass
class Schedule:
    """When each job ran: the input to node assignment and to 'idle while jobs wait'.

    Sizes and capacity are in cores when ``cores_per_node`` > 1 (jobs may share nodes), else in nodes."""

    capacity: int
    submit: np.ndarray
    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    kind: str
    cores_per_node: int = 1
    reservation: np.ndarray | None = None  # EASY: the first reservation made for a job at the queue head

    def waiting_count(self) -> tuple[np.ndarray, np.ndarray]:
        """Step function of jobs waiting in the queue: (times, count from times[i] on)."""
        w = self.start > self.submit
        return step_count(self.submit[w], self.start[w])


def _header_value(line: str) -> tuple[str, str] | None:
    body = line.lstrip(";").strip()
    if ":" not in body:
        return None
    k, v = body.split(":", 1)
    return k.strip(), v.strip()


MAX_VALUE = 1e12            # no SWF time or size is larger (s: 31,700 years; cores: ...): beyond it, a damaged line
MAX_NODES = 1_000_000       # capacity sanity caps: per-node arrays are allocated from these
MAX_CORES_PER_NODE = 100_000


def read_swf(path: str | Path, *, units: str = "auto", cores_per_node: int | None = None,
             capacity: int | None = None, variant: str = "auto", lenient: bool = False) -> SwfTrace:
    """Parse an SWF file (gzip or not).

    units: ``nodes`` | ``cores`` | ``auto`` (cores when the header's MaxProcs > MaxNodes).
    variant: ``standard`` | ``walltime6`` (requested walltime in field 6) | ``auto`` (walltime6 when field 9 is
    almost always -1 and field 6 is set).
    Jobs without a run time or size (cancelled before start) are skipped and counted in ``skipped``.
    In core units jobs are scheduled on cores and packed onto nodes (see assign_nodes): a node counts as idle
    only when all of its cores are.
    """
    p = str(path)
    bad = BadRows(lenient)
    header: dict[str, str] = {}
    header_line: dict[str, int] = {}
    rows: list[tuple[float, ...]] = []
    lines: list[int] = []
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            s = line.strip()
            if not s:
                continue
            if s.startswith(";"):
                kv = _header_value(s)
                if kv:
                    header.setdefault(kv[0], kv[1])
                    header_line.setdefault(kv[0], lineno)
                continue
            parts = s.split()
            if len(parts) < 18:
                bad.add(InputError(p, lineno, None, f"SWF needs 18 fields, found {len(parts)}"))
                continue
            try:
                vals = tuple(float(parts[i - 1]) for i in (1, 2, 3, 4, 5, 6, 8, 9))
                if not all(abs(v) <= MAX_VALUE for v in vals):      # NaN, inf and absurd magnitudes
                    raise ValueError
            except ValueError:
                for i in (1, 2, 3, 4, 5, 6, 8, 9):
                    try:
                        v = float(parts[i - 1])
                    except ValueError:
                        bad.add(InputError(p, lineno, f"{i} ({FIELD_NAMES[i]})", f"not a number: {parts[i - 1]!r}"))
                        break
                    if not abs(v) <= MAX_VALUE:
                        bad.add(InputError(p, lineno, f"{i} ({FIELD_NAMES[i]})",
                                           f"not a finite number of at most {MAX_VALUE:g}: {parts[i - 1]!r}"))
                        break
                continue
            rows.append(vals)
            lines.append(lineno)
    if not rows:
        raise InputError(p, 0, None, "no job lines in SWF file")
    a = np.array(rows)
    line_no = np.array(lines)
    jid, sub, wait, run, alloc, f6, reqp, reqt = a.T

    if variant == "auto":
        variant = "walltime6" if (np.mean(reqt == -1) > 0.95 and np.mean(f6 > 0) > 0.5) else "standard"
    if variant not in ("standard", "walltime6"):
        raise ValueError(f"unknown SWF variant {variant!r}: use standard, walltime6 or auto")
    requested = f6 if variant == "walltime6" else reqt

    max_nodes = _int_header(header, "MaxNodes")
    max_procs = _int_header(header, "MaxProcs")
    if units == "auto":
        units = "cores" if (max_nodes and max_procs and max_procs > max_nodes) else "nodes"
    if units == "cores":
        if cores_per_node is None:
            if not (max_nodes and max_procs):
                raise InputError(p, 0, "MaxNodes", "units=cores needs cores_per_node (no MaxNodes/MaxProcs header)")
            cores_per_node = max_procs // max_nodes
    elif units != "nodes":
        raise ValueError(f"unknown units {units!r}: use nodes, cores or auto")
    cpn = cores_per_node if units == "cores" else 1

    size = np.where(alloc > 0, alloc, reqp)
    for col, num in ((alloc, F_ALLOC), (reqp, F_REQPROCS), (sub, F_SUBMIT)):
        floor = 0 if num == F_SUBMIT else -1   # -1 is SWF's "unknown"
        for i in np.flatnonzero(col < floor):
            bad.add(InputError(p, int(line_no[i]), f"{num} ({FIELD_NAMES[num]})", f"negative value {col[i]:g}"))
    ok = (alloc >= -1) & (reqp >= -1) & (sub >= 0)

    skipped: dict[str, int] = {}
    no_run = ok & (run <= 0)
    no_size = ok & ~no_run & (size <= 0)
    skipped["no run time (cancelled)"] = int(no_run.sum())
    skipped["no size"] = int(no_size.sum())
    keep = ok & ~no_run & ~no_size
    size = size.astype(np.int64)

    if not keep.any():
        raise InputError(p, 0, None, "no job with a run time and a size in SWF file")
    if cpn < 1:
        raise InputError(p, header_line.get("MaxProcs", 0), "MaxProcs", f"fewer cores than nodes ({max_procs} < "
                         f"{max_nodes}): cannot be a core count")
    if capacity is None:   # capacity is in nodes; schedule in the log's units
        capacity = max_nodes or (max_procs // cpn if max_procs else None)
    guessed = not capacity
    if guessed:
        capacity = int(np.ceil(size[keep].max() / cpn))
    if capacity > MAX_NODES or cpn > MAX_CORES_PER_NODE:
        key = "MaxNodes" if max_nodes else "MaxProcs" if max_procs else None
        line = header_line.get(key, 0) if key else int(line_no[keep][np.argmax(size[keep])])
        what = (f"{capacity:,} nodes" if cpn <= MAX_CORES_PER_NODE else f"{cpn:,} cores per node")
        raise InputError(p, line, key or f"{F_ALLOC} ({FIELD_NAMES[F_ALLOC]})",
                         f"{what} is beyond any machine (sanity caps: {MAX_NODES:,} nodes, "
                         f"{MAX_CORES_PER_NODE:,} cores per node)")
    if guessed:
        import warnings
        warnings.warn(f"{p}: no MaxNodes/MaxProcs header; assuming capacity = largest job = {capacity} nodes",
                      stacklevel=2)
    cap = capacity * cpn
    for i in np.flatnonzero(keep & (size > cap)):
        bad.add(InputError(p, int(line_no[i]), f"{F_ALLOC} ({FIELD_NAMES[F_ALLOC]})",
                           f"job needs {size[i]} {units}, machine has {cap}"))
    keep &= size <= cap
    bad.warn()

    order = np.argsort(sub[keep], kind="stable")
    sel = lambda x: x[keep][order]  # noqa: E731
    est = np.maximum(sel(requested), sel(run))
    return SwfTrace(p, int(cap), sel(jid).astype(np.int64), sel(sub), sel(wait), sel(run), sel(size), est,
                    units, cpn, variant, {k: v for k, v in skipped.items() if v})


def _int_header(header: dict[str, str], key: str) -> int | None:
    v = header.get(key, "").split()
    try:
        n = int(float(v[0])) if v else None
    except (ValueError, OverflowError):          # 'nan', 'inf': as if absent
        return None
    return n if n is None or n > 0 else None


def recorded_schedule(trace: SwfTrace) -> Schedule:
    """The schedule as logged: start = submit + wait. Fails if the log has no waits or exceeds capacity."""
    if np.any(trace.wait < 0):
        n = int(np.sum(trace.wait < 0))
        raise InputError(trace.path, 0, f"{F_WAIT} ({FIELD_NAMES[F_WAIT]})",
                         f"{n} jobs have no wait time (-1): the recorded schedule is unknown; use --schedule easy")
    start = trace.submit + trace.wait
    return Schedule(trace.capacity, trace.submit, start, start + trace.run, trace.size, "recorded",
                    trace.cores_per_node)


def peak_usage(s: Schedule) -> tuple[float, int]:
    """(time, nodes) of the highest simultaneous use, ends before starts at equal times."""
    t = np.concatenate([s.end, s.start])
    d = np.concatenate([-s.size, s.size])
    order = np.lexsort((d, t))
    use = np.cumsum(d[order])
    i = int(np.argmax(use))
    return float(t[order][i]), int(use[i])


def assign_nodes(s: Schedule, *, t0: float | None = None, t1: float | None = None,
                 source: str = "", max_overflow: float = 0.001) -> IdleIntervals:
    """Give each job concrete nodes and return every node's idle intervals.

    Jobs take the nodes that have been free longest (FIFO), so idleness spreads over the machine as on a real
    one and any slice of N nodes (``--nodes N``) is a fair sample; lowest-id-first would make the first nodes
    almost never idle. Core logs pack jobs onto nodes: whole free nodes for whole multiples, the best-fitting
    partly used node for the rest, so that small jobs leave as many nodes completely free as they can. Span: first start .. last submit by default (after the last submit the queue
    only drains, which is not idle capacity anyone would have had).

    Recorded logs are sometimes a little inconsistent (theta_2022: 9 instants, 0.003% of the time, above
    capacity). A job that starts when too few nodes are free gets the free ones and the shortfall is counted;
    beyond ``max_overflow`` of the jobs the schedule is rejected (replay it with EASY instead).
    """
    if len(s.start) == 0:
        raise ValueError("empty schedule")
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

    def __init__(self, n_nodes: int, cpn: int, t0: float, source: str):
        self.cpn = cpn
        self.free = [cpn] * n_nodes
        self.full = deque(range(n_nodes))           # completely free nodes, longest free first
        self.partial = [[] for _ in range(cpn)]     # heaps of partly used nodes, by free cores (lazy)
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
        self.free_total -= c
        cpn, got = self.cpn, []
        while c >= cpn and self.full:
            k = self.full.popleft()
            self._occupy(k, t)
            self.free[k] = 0
            got.append((k, cpn))
            c -= cpn
        while c > 0:
            k = None
            for f in range(c, cpn):                  # best fit among partly used nodes
                k = self._pop_partial(f)
                if k is not None:
                    break
            if k is None and self.full:
                k = self.full.popleft()
                self._occupy(k, t)
            if k is None:                            # fragmented: spill over the fullest partial nodes
                for f in range(cpn - 1, 0, -1):
                    k = self._pop_partial(f)
                    if k is not None:
                        break
            use = min(c, self.free[k])
            self.free[k] -= use
            c -= use
            got.append((k, use))
            if 0 < self.free[k]:
                heapq.heappush(self.partial[self.free[k]], k)
        return got

    def give(self, held: list[tuple[int, int]], t: float) -> None:
        for k, c in held:
            self.free[k] += c
            self.free_total += c
            if self.free[k] == self.cpn:
                self.idle_since[k] = t
                self.full.append(k)
            else:
                heapq.heappush(self.partial[self.free[k]], k)

    def intervals(self, t0: float, t1: float) -> IdleIntervals:
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

    def __init__(self, n_nodes: int, cpn: int, t0: float, source: str):
        super().__init__(n_nodes, 1, t0, source)
        self.pool = np.arange(n_nodes)
        self.since = np.full(n_nodes, t0)
        self.chunks: list[tuple[np.ndarray, np.ndarray, float]] = []

    def take(self, c: int, t: float):  # type: ignore[override]
        self.free_total -= c
        got, self.pool = self.pool[:c], self.pool[c:]
        was = self.since[got]
        hit = t > was
        self.chunks.append((got[hit], was[hit], t))
        self.since[got] = np.inf
        return got

    def give(self, held, t: float) -> None:  # type: ignore[override]
        self.free_total += len(held)
        self.since[held] = t
        self.pool = np.concatenate([self.pool, held])

    def intervals(self, t0: float, t1: float) -> IdleIntervals:
        node, start, end = self.out
        for got, was, t in self.chunks:
            node.extend(got.tolist())
            start.extend(was.tolist())
            end.extend([t] * len(got))
        self.idle_since = self.since.tolist()
        return super().intervals(t0, t1)
