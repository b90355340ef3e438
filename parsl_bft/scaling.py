"""Throughput curves P(n): exact at measured points, Amdahl-shaped in gaps and beyond the table.

Between two measured sizes a and b the curve is the global Amdahl fit f(n) plus a linearly interpolated
correction (P(a) - f(a) .. P(b) - f(b)), so it passes through every measurement and follows Amdahl's shape
where a table is sparse (1, 8, 64 nodes). Outside the table f(n) is scaled to meet the nearest measurement.
A dense table (1, 2, 4, ...) is then practically piecewise-linear, like BFTrainer's interpolation.

Layer elasticity: optional columns ``freeze,layers,frozen_compute,frozen_params`` say a row was measured with the
model's first ``freeze`` of ``layers`` layers frozen, which hold those shares of its compute and parameters
(``parsl-bft profile --freeze-levels``). Rows without them (and every older file) are level 0; the level-0 rows
make the ``ScalingCurve``, the others a ``LayerProfile`` (planner/freeze.py predicts the levels in between).
"""
from __future__ import annotations

import csv
import warnings
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

from .csvio import parse_number, read_rows
from .errors import BadRows, BadValue, InputError

SCALING_COLUMNS = ["model", "nodes", "samples_per_sec"]
FREEZE_COLUMNS = ["freeze", "layers", "frozen_compute", "frozen_params"]
MAX_LAYERS = 100_000            # freezable blocks of one model: a sanity cap, as for nodes (jobs.MAX_JOB_NODES)


def fit_amdahl(nodes: np.ndarray, rates: np.ndarray) -> tuple[float, float]:
    """Least-squares (relative error) fit of P(n) = a * n / (1 + s (n - 1)); returns (a, s).

    s is the serial fraction in [0, 1]. One point cannot separate a from s: s = 0 (linear) then.
    """
    n = np.asarray(nodes, dtype=float)
    p = np.asarray(rates, dtype=float)
    if len(n) < 2:
        return float(p[0] / n[0]), 0.0
    best = (np.inf, 0.0, 0.0)
    for s in np.concatenate([np.linspace(0, 0.02, 201), np.linspace(0.02, 1, 981)]):
        g = n / (1 + s * (n - 1))
        a = float(np.sum(g / p) / np.sum(g * g / (p * p)))
        err = float(np.sum((1 - a * g / p) ** 2))
        if err < best[0]:
            best = (err, a, float(s))
    return best[1], best[2]


MAX_NODES = 1_000_000
MIN_RATE, MAX_RATE = 1e-6, 1e15     # samples/s: outside this, a unit mix-up or a damaged file


@dataclass
class ScalingCurve:
    """Measured throughput of one model; ``rate(n)`` in samples/s for any integer n >= 0."""

    model: str
    points: dict[int, float]
    _a: float = field(init=False, repr=False)
    _s: float = field(init=False, repr=False)
    _cache: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.points:
            raise BadValue(f"scaling curve for {self.model!r} has no points")
        for n, r in self.points.items():
            if int(n) != n or n < 1 or not r > 0:
                raise BadValue(f"scaling curve {self.model!r}: bad point nodes={n} rate={r}")
            if n > MAX_NODES or not MIN_RATE <= r <= MAX_RATE:
                raise BadValue(f"scaling curve {self.model!r}: nodes={n} rate={r} is outside the sane range "
                               f"(nodes <= {MAX_NODES:,}, {MIN_RATE:g} <= samples/s <= {MAX_RATE:g})")
        self.points = {int(n): float(r) for n, r in sorted(self.points.items())}
        ns = np.array(list(self.points), dtype=float)
        ps = np.array(list(self.points.values()))
        self._a, self._s = fit_amdahl(ns, ps)
        self._cache = np.zeros(1)

    @property
    def serial_fraction(self) -> float:
        """Amdahl's serial fraction s of the fit P(n) = a n / (1 + s (n - 1))."""
        return self._s

    def _amdahl(self, n: np.ndarray) -> np.ndarray:
        n = np.maximum(n, 1.0)        # P(0) is set to 0 by the caller; avoid 0/0 when s == 1
        return self._a * n / (1 + self._s * (n - 1))

    def _compute(self, n: np.ndarray) -> np.ndarray:
        ns = np.array(list(self.points), dtype=float)
        ps = np.array(list(self.points.values()))
        resid = ps - self._amdahl(ns)
        n = n.astype(float)
        out = self._amdahl(n) + np.interp(n, ns, resid)
        lo, hi = n < ns[0], n > ns[-1]
        out[lo] = self._amdahl(n[lo]) * ps[0] / self._amdahl(ns[:1])[0]
        out[hi] = self._amdahl(n[hi]) * ps[-1] / self._amdahl(ns[-1:])[0]
        out[n == 0] = 0.0
        return out

    def table(self, max_nodes: int) -> np.ndarray:
        """rates[k] = P(k) for k = 0..max_nodes (rates[0] = 0)."""
        if len(self._cache) <= max_nodes:
            self._cache = self._compute(np.arange(max(max_nodes + 1, 2 * len(self._cache))))
        return self._cache[: max_nodes + 1]

    def rate(self, n: int) -> float:
        """Samples/s on ``n`` nodes (0 on none): measured points as measured, the Amdahl fit between them."""
        return float(self.table(n)[n]) if n > 0 else 0.0

    def speedup(self, n: int) -> float:
        """P(n) / P(1): the normalisation that keeps slow models from being starved."""
        return self.rate(n) / self.rate(1)


@dataclass
class LayerProfile:
    """What was measured of one model with layers frozen. ``shares[f]`` = (frozen share of compute, of parameters)
    with the first f of ``n_layers`` layers frozen (f = 0: (0, 0)); ``points[(nodes, f)]`` = samples/s, f >= 1."""

    model: str
    n_layers: int
    shares: dict[int, tuple[float, float]]
    points: dict[tuple[int, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_layers < 1:
            raise BadValue(f"layer profile {self.model!r}: layers must be >= 1, got {self.n_layers}")
        self.shares = {0: (0.0, 0.0), **self.shares}
        for f, (c, q) in self.shares.items():
            if not 0 <= f < self.n_layers:
                raise BadValue(f"layer profile {self.model!r}: freeze level {f} is not in 0..{self.n_layers - 1} "
                               "(at least one layer must train)")
            if not (0 <= c <= 1 and 0 <= q <= 1):
                raise BadValue(f"layer profile {self.model!r}: frozen shares at level {f} must be fractions, "
                               f"got compute={c} params={q}")
        missing = sorted({f for _, f in self.points} - set(self.shares))
        if missing:
            raise BadValue(f"layer profile {self.model!r}: level {missing[0]} measured without its frozen shares")

    @property
    def levels(self) -> list[int]:
        """Freeze levels the planner may choose (those whose shares are known)."""
        return sorted(self.shares)


@dataclass
class ScalingTable:
    """A scaling file's contents: one throughput curve per model, and the layer profile of the models measured
    with layers frozen."""

    curves: dict[str, ScalingCurve]
    layers: dict[str, LayerProfile]


def read_scaling_csv(path: str | Path, *, lenient: bool = False) -> dict[str, ScalingCurve]:
    """Read ``model,nodes,samples_per_sec`` rows into one curve per model (level-0 rows of layered files)."""
    return read_scaling_table(path, lenient=lenient).curves


def _freeze_fields(p: str, line: int, row: dict[str, str]) -> tuple[int, int, float, float] | None:
    """(level, layers, compute share, param share) of a row that has the freeze columns filled, else None."""
    if not row.get("freeze") and not row.get("layers"):
        return None
    f = int(parse_number(p, line, "freeze", row.get("freeze") or "0", kind=int, minimum=0))
    n = int(parse_number(p, line, "layers", row.get("layers", ""), kind=int, minimum=1))
    if n > MAX_LAYERS:                  # per-layer arrays are sized by it
        raise InputError(p, line, "layers", f"{n:,} layers is beyond any model (sanity cap {MAX_LAYERS:,})")
    if f >= n:
        raise InputError(p, line, "freeze", f"level {f} freezes all {n} layers: at least one must train")
    shares = []
    for c in ("frozen_compute", "frozen_params"):
        x = parse_number(p, line, c, row.get(c) or "0", minimum=0)
        if x > 1:
            raise InputError(p, line, c, f"a share of the model, in [0, 1]; got {x:g}")
        shares.append(x)
    if f == 0 and any(shares):          # level 0's shares are (0, 0) by definition: these were silently dropped
        raise InputError(p, line, "frozen_compute", f"freeze level 0 freezes nothing: its shares must be 0, got "
                                                    f"{shares[0]:g}, {shares[1]:g} (a missing freeze level?)")
    return f, n, shares[0], shares[1]


def read_scaling_table(path: str | Path, *, lenient: bool = False) -> ScalingTable:
    """Level-0 curves and, for models measured with layers frozen, their ``LayerProfile``."""
    p = str(path)
    bad = BadRows(lenient)
    points: dict[str, dict[int, float]] = {}
    frozen: dict[str, dict] = {}
    for line, row in read_rows(path, SCALING_COLUMNS, bad):
        try:
            model = row["model"]
            if not model:
                raise InputError(p, line, "model", "empty model name")
            n = int(parse_number(p, line, "nodes", row["nodes"], kind=int, minimum=1))
            r = parse_number(p, line, "samples_per_sec", row["samples_per_sec"], strictly_positive=True)
            if n > MAX_NODES:
                raise InputError(p, line, "nodes", f"{n:,} nodes is beyond any machine (sanity cap {MAX_NODES:,})")
            if not MIN_RATE <= r <= MAX_RATE:
                raise InputError(p, line, "samples_per_sec", f"{r:g} is outside the sane range "
                                                             f"{MIN_RATE:g} .. {MAX_RATE:g} samples/s")
            ff = _freeze_fields(p, line, row)
            level = ff[0] if ff else 0
            if ff:
                prof = frozen.setdefault(model, {"layers": ff[1], "shares": {}, "points": {}})
                if prof["layers"] != ff[1]:
                    raise InputError(p, line, "layers", f"{model} has {prof['layers']} layers on an earlier row")
                if prof["shares"].setdefault(level, ff[2:]) != ff[2:]:
                    raise InputError(p, line, "frozen_compute", f"{model} level {level}: other shares than an "
                                                                 "earlier row")
            if (level and (n, level) in frozen[model]["points"]) or (not level and n in points.get(model, {})):
                raise InputError(p, line, "nodes", f"duplicate measurement for {model} at {n} nodes"
                                                   + (f", freeze level {level}" if level else ""))
        except InputError as e:
            bad.add(e)
            continue
        if level:
            frozen[model]["points"][(n, level)] = r
        else:
            points.setdefault(model, {})[n] = r
    if not points:
        raise InputError(p, 0, None, "no scaling rows" + (" at freeze level 0" if frozen else ""))
    lost = sorted(set(frozen) - set(points))
    if lost:
        raise InputError(p, 0, "freeze", f"model {lost[0]} has rows only with layers frozen: measure level 0 too")
    curves = {m: ScalingCurve(m, pts) for m, pts in points.items()}
    _warn_slower_on_more_nodes(p, points)
    try:
        layers = {m: LayerProfile(m, d["layers"], d["shares"], d["points"]) for m, d in frozen.items()}
    except ValueError as e:
        raise InputError(p, 0, "freeze", str(e)) from None
    bad.warn()
    return ScalingTable(curves, layers)


def _warn_slower_on_more_nodes(p: str, points: dict[str, dict[int, float]]) -> None:
    """Say so when a model trains slower on more nodes: real (contention) or a typo, it changes every plan."""
    for model, pts in points.items():
        ns = sorted(pts)
        drop = next(((a, b) for a, b in pairwise(ns) if pts[b] < pts[a]), None)
        if drop:
            a, b = drop
            warnings.warn(f"{p}: {model} trains slower on {b} nodes ({pts[b]:g} samples/s) than on {a} "
                          f"({pts[a]:g}): check the measurement", stacklevel=3)


def write_scaling_csv(path: str | Path, curves: dict[str, ScalingCurve] | list[tuple]) -> None:
    """Rows (model, nodes, samples/s) or (model, nodes, samples/s, freeze, layers, frozen_compute,
    frozen_params); the freeze columns are written when any row has them."""
    rows = (curves if isinstance(curves, list)
            else [(c.model, n, r) for c in curves.values() for n, r in c.points.items()])
    layered = any(len(r) > 3 for r in rows)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(SCALING_COLUMNS + (FREEZE_COLUMNS if layered else []))
        for model, n, r, *rest in rows:
            extra = [rest[0], rest[1], f"{rest[2]:.6g}", f"{rest[3]:.6g}"] if rest else ["", "", "", ""]
            w.writerow([model, n, f"{r:.6g}"] + (extra if layered else []))
