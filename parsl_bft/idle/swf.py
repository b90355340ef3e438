"""Standard Workload Format job logs: parsing (read_swf -> SwfTrace).

SWF (one job per line, 18 fields, ``;`` header comments) records submit, wait, run time and size but no node
ids. A log becomes idle intervals in two more steps, each in a module of its own: a schedule (schedule.py: the
recorded one, start = submit + wait; or easy.py's FCFS + EASY-backfill replay), then concrete nodes
(node_assignment.py). Their names are re-exported here, where callers have always imported them.

Variants handled: extended SWF with extra trailing columns; the ALCF/Mira convention of the requested walltime
in field 6 (field 9 = -1) with rows not sorted by submit time; logs counted in cores (``units="cores"``) whose
jobs are scheduled on cores and packed onto nodes; only completely free nodes count as idle (training needs them).
"""
from __future__ import annotations

import warnings
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..csvio import open_text
from ..errors import BadRows, BadValue, InputError
from .node_assignment import assign_nodes
from .schedule import Schedule, peak_usage, recorded_schedule
from .swf_format import (
    F_ALLOC,
    F_AVGCPU,
    F_ID,
    F_REQPROCS,
    F_REQTIME,
    F_RUN,
    F_SUBMIT,
    F_WAIT,
    FIELD_NAMES,
    MAX_CORES_PER_NODE,
    MAX_JOB_LINES,
    MAX_NODES,
    MAX_VALUE,
    SwfTrace,
    field_label,
)

__all__ = ["FIELD_NAMES", "F_ALLOC", "F_AVGCPU", "F_ID", "F_REQPROCS", "F_REQTIME", "F_RUN", "F_SUBMIT", "F_WAIT",
           "MAX_CORES_PER_NODE", "MAX_NODES", "MAX_VALUE", "Schedule", "SwfTrace", "assign_nodes", "peak_usage",
           "read_swf", "recorded_schedule"]

_COLUMNS = (F_ID, F_SUBMIT, F_WAIT, F_RUN, F_ALLOC, F_AVGCPU, F_REQPROCS, F_REQTIME)   # the fields read, in order


@dataclass
class _Lines:
    """What the file holds before any interpretation: header keys (and their lines) and the numeric job rows."""

    header: dict[str, str] = field(default_factory=dict)
    header_line: dict[str, int] = field(default_factory=dict)
    # flat machine numbers (the fields of _COLUMNS, row after row), not a tuple of float objects a row: a 1.1 GB
    # log took 11.5 GB that way
    rows: array[float] = field(default_factory=lambda: array("d"))
    lines: array[int] = field(default_factory=lambda: array("q"))


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
    got = _read_lines(path, p, bad)
    if not got.lines:
        raise InputError(p, 0, None, "no job lines in SWF file")
    a = np.frombuffer(got.rows, dtype=np.float64).reshape(-1, len(_COLUMNS))
    line_no = np.frombuffer(got.lines, dtype=np.int64)
    jid, sub, wait, run, alloc, f6, reqp, reqt = a.T
    variant = _choose_variant(variant, reqt, f6)
    requested = f6 if variant == "walltime6" else reqt

    max_nodes = _int_header(got.header, "MaxNodes")
    max_procs = _int_header(got.header, "MaxProcs")
    units, cpn = _choose_units(p, units, cores_per_node, max_nodes, max_procs)

    size = np.where(alloc > 0, alloc, reqp)
    keep, skipped = _usable(p, bad, line_no, sub, run, alloc, reqp, size)
    size = size.astype(np.int64)

    if not keep.any():
        raise InputError(p, 0, None, "no job with a run time and a size in SWF file")
    if cpn < 1:
        raise InputError(p, got.header_line.get("MaxProcs", 0), "MaxProcs", f"fewer cores than nodes ({max_procs} "
                         f"< {max_nodes}): cannot be a core count")
    capacity = _capacity(p, capacity, cpn, max_nodes, max_procs, got.header_line, line_no, size, keep)
    cap = capacity * cpn
    for i in np.flatnonzero(keep & (size > cap)):
        bad.add(InputError(p, int(line_no[i]), field_label(F_ALLOC), f"job needs {size[i]} {units}, machine has {cap}"))
    keep &= size <= cap
    bad.warn()

    order = np.argsort(sub[keep], kind="stable")
    sel = lambda x: x[keep][order]  # noqa: E731
    est = np.maximum(sel(requested), sel(run))
    return SwfTrace(p, int(cap), sel(jid).astype(np.int64), sel(sub), sel(wait), sel(run), sel(size), est,
                    units, cpn, variant, {k: v for k, v in skipped.items() if v})


def _header_value(line: str) -> tuple[str, str] | None:
    body = line.lstrip(";").strip()
    if ":" not in body:
        return None
    k, v = body.split(":", 1)
    return k.strip(), v.strip()


def _read_lines(path: str | Path, p: str, bad: BadRows) -> _Lines:
    """Header keys and the numeric rows (the fields of ``_COLUMNS``); bad lines go to ``bad``."""
    got = _Lines()
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            s = line.strip()
            if not s:
                continue
            if s.startswith(";"):
                kv = _header_value(s)
                if kv:
                    got.header.setdefault(kv[0], kv[1])
                    got.header_line.setdefault(kv[0], lineno)
                continue
            parts = s.split()
            if len(parts) < 18:
                bad.add(InputError(p, lineno, None, f"SWF needs 18 fields, found {len(parts)}"))
                continue
            try:
                vals = tuple(float(parts[i - 1]) for i in _COLUMNS)
                if not all(abs(v) <= MAX_VALUE for v in vals):      # NaN, inf and absurd magnitudes
                    raise ValueError
            except ValueError:
                _bad_number(bad, p, lineno, parts)
                continue
            frac = next((i for i in (F_ALLOC, F_REQPROCS) if not vals[_COLUMNS.index(i)].is_integer()), None)
            if frac is not None:                # a size of 4.5 processors was read as 4 before
                bad.add(InputError(p, lineno, field_label(frac), f"must be a whole number: {parts[frac - 1]!r}"))
                continue
            if len(got.lines) == MAX_JOB_LINES:
                raise InputError(p, lineno, None, f"more than {MAX_JOB_LINES:,} job lines: beyond any log this "
                                 "replays (cut it to the weeks you need)")
            got.rows.extend(vals)
            got.lines.append(lineno)
    return got


def _bad_number(bad: BadRows, p: str, lineno: int, parts: list[str]) -> None:
    """Name the first field of a job line that is not a finite number within MAX_VALUE."""
    for i in _COLUMNS:
        try:
            v = float(parts[i - 1])
        except ValueError:
            bad.add(InputError(p, lineno, field_label(i), f"not a number: {parts[i - 1]!r}"))
            break
        if not abs(v) <= MAX_VALUE:
            bad.add(InputError(p, lineno, field_label(i),
                               f"not a finite number of at most {MAX_VALUE:g}: {parts[i - 1]!r}"))
            break


def _choose_variant(variant: str, reqt: np.ndarray, f6: np.ndarray) -> str:
    """``auto``: walltime6 when field 9 is almost always -1 and field 6 is set."""
    if variant == "auto":
        variant = "walltime6" if (np.mean(reqt == -1) > 0.95 and np.mean(f6 > 0) > 0.5) else "standard"
    if variant not in ("standard", "walltime6"):
        raise BadValue(f"unknown SWF variant {variant!r}: use standard, walltime6 or auto")
    return variant


def _choose_units(p: str, units: str, cores_per_node: int | None, max_nodes: int | None,
                  max_procs: int | None) -> tuple[str, int]:
    """(units, cores per node): ``auto`` is cores when the header's MaxProcs > MaxNodes; 1 core per node unit."""
    if units == "auto":
        units = "cores" if (max_nodes and max_procs and max_procs > max_nodes) else "nodes"
    if units == "cores":
        if cores_per_node is None:
            if not (max_nodes and max_procs):
                raise InputError(p, 0, "MaxNodes", "units=cores needs cores_per_node (no MaxNodes/MaxProcs header)")
            cores_per_node = max_procs // max_nodes
    elif units != "nodes":
        raise BadValue(f"unknown units {units!r}: use nodes, cores or auto")
    return units, (cores_per_node if units == "cores" and cores_per_node is not None else 1)


def _usable(p: str, bad: BadRows, line_no: np.ndarray, sub: np.ndarray, run: np.ndarray, alloc: np.ndarray,
            reqp: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """The jobs to keep, and how many were skipped on purpose by reason; negative values go to ``bad``."""
    for col, num in ((alloc, F_ALLOC), (reqp, F_REQPROCS), (sub, F_SUBMIT)):
        floor = 0 if num == F_SUBMIT else -1   # -1 is SWF's "unknown"
        for i in np.flatnonzero(col < floor):
            bad.add(InputError(p, int(line_no[i]), field_label(num), f"negative value {col[i]:g}"))
    ok = (alloc >= -1) & (reqp >= -1) & (sub >= 0)
    no_run = ok & (run <= 0)
    no_size = ok & ~no_run & (size <= 0)
    skipped = {"no run time (cancelled)": int(no_run.sum()), "no size": int(no_size.sum())}
    return ok & ~no_run & ~no_size, skipped


def _capacity(p: str, capacity: int | None, cpn: int, max_nodes: int | None, max_procs: int | None,
              header_line: dict[str, int], line_no: np.ndarray, size: np.ndarray, keep: np.ndarray) -> int:
    """The machine's size in nodes: given, else from the header, else (with a warning) the largest job."""
    if capacity is None:   # capacity is in nodes; schedule in the log's units
        capacity = max_nodes or (max_procs // cpn if max_procs else None)
    guessed = not capacity
    if guessed:
        capacity = int(np.ceil(size[keep].max() / cpn))
    assert capacity is not None
    if capacity > MAX_NODES or cpn > MAX_CORES_PER_NODE:
        key = "MaxNodes" if max_nodes else "MaxProcs" if max_procs else None
        line = header_line.get(key, 0) if key else int(line_no[keep][np.argmax(size[keep])])
        what = (f"{capacity:,} nodes" if cpn <= MAX_CORES_PER_NODE else f"{cpn:,} cores per node")
        raise InputError(p, line, key or field_label(F_ALLOC),
                         f"{what} is beyond any machine (sanity caps: {MAX_NODES:,} nodes, "
                         f"{MAX_CORES_PER_NODE:,} cores per node)")
    if guessed:
        warnings.warn(f"{p}: no MaxNodes/MaxProcs header; assuming capacity = largest job = {capacity} nodes",
                      stacklevel=3)
    return capacity


def _int_header(header: dict[str, str], key: str) -> int | None:
    v = header.get(key, "").split()
    try:
        n = int(float(v[0])) if v else None
    except (ValueError, OverflowError):          # 'nan', 'inf': as if absent
        return None
    return n if n is None or n > 0 else None
