"""Layer elasticity (after IceFrog, with parsl-bft's own models): what freezing the first f layers of a model
buys in throughput, what it costs in training progress, and which level a job should run at. No Parsl here.

Layer-aware throughput. The level-0 curve P(n) gives the time of one sample, 1/P(n); its Amdahl fit splits it
into a part that shrinks with n (compute, share (1-s)/n over s + (1-s)/n) and a part that does not
(synchronisation and other serial overheads). Freezing a prefix that holds a share c of the compute and q of
the parameters removes the prefix's backward pass (beta * c of the compute) and its gradients from the
all-reduce (gamma * q of the rest):
    1/P(n, f) = 1/P(n) * (par(n) * (1 - beta c_f) + ser(n) * (1 - gamma q_f)).
beta and gamma are fitted (least squares, linear) on the measured (n, f) points; measured points are used as
they are, the model fills the gaps; ``heldout_mape`` reports leave-one-out error.

Frozen penalty. Fragments record, per layer, the L1 norm of its gradient summed over intervals of steps
(train/freezing.py). A layer's plasticity is how fast that norm still changes, r_i = |g_prev - g_now| / g_prev
(AutoFreeze's rate); its weight in the learning is its share of the gradient norm. Freezing the first k layers
loses   penalty(k) = sum_{i<k} share_i * min(1, r_i / median(r))   of the job's progress: a layer that has
settled (small r, little gradient) costs ~nothing, one still changing as fast as the median layer costs its whole
share. Effective progress = P(n, f) * (1 - penalty(f)).

Budget. A job with ``accuracy_budget`` B has spent sum(penalty * samples trained at that level / samples): a
lost share of progress is counted as that much accuracy (conservative: accuracy gains little from the last
part of a run). A level is allowed only if staying at it to the end keeps the spend within B (spent + penalty *
remaining share; a change of level needs twice that headroom, so levels do not flap); levels only go up unless
the job allows unfreezing, or its level no longer fits the budget.
Without statistics (a job that has not trained yet) only level 0 is allowed: nothing is frozen on faith.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..scaling import LayerProfile, ScalingCurve

BETA0, GAMMA0 = 2.0 / 3.0, 1.0    # backward ~ 2/3 of a layer's compute; a frozen layer sends no gradient
UP_MARGIN = 2.0                    # headroom a level change needs, in multiples of its projected spend


@dataclass
class LayerThroughput:
    """Samples/s at (nodes, freeze level) from a model's level-0 curve and its measured layer profile."""

    curve: ScalingCurve
    profile: LayerProfile
    beta: float = field(init=False)
    gamma: float = field(init=False)

    def __post_init__(self) -> None:
        self.beta, self.gamma = self._fit(self.profile.points)

    def _split(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shares of a sample's time that shrink with n (compute) and that do not (serial, synchronisation)."""
        s = self.curve.serial_fraction
        n = np.maximum(np.asarray(n, dtype=float), 1.0)
        par = (1 - s) / n
        return par / (s + par), s / (s + par)

    def _fit(self, points: dict[tuple[int, int], float]) -> tuple[float, float]:
        if not points:
            return BETA0, GAMMA0
        ns = np.array([n for n, _ in points])
        c = np.array([self.profile.shares[f][0] for _, f in points])
        q = np.array([self.profile.shares[f][1] for _, f in points])
        par, ser = self._split(ns)
        base = np.array([self.curve.rate(int(n)) for n in ns])
        saved = 1.0 - base / np.array(list(points.values()))       # share of the level-0 time saved
        a = np.column_stack([par * c, ser * q])
        if not np.any(a[:, 1]):                                     # no serial time measured: gamma stays a prior
            beta = float(np.linalg.lstsq(a[:, :1], saved, rcond=None)[0][0])
            return float(np.clip(beta, 0.0, 1.0)), GAMMA0
        beta, gamma = np.linalg.lstsq(a, saved, rcond=None)[0]
        return float(np.clip(beta, 0.0, 1.0)), float(np.clip(gamma, 0.0, 1.0))

    def _factor(self, ns: np.ndarray, f: int, beta: float, gamma: float) -> np.ndarray:
        """The model's P(n, f) / P(n, 0) (measured points not substituted)."""
        c, q = self.profile.shares[f]
        par, ser = self._split(ns)
        return 1.0 / (par * (1 - beta * c) + ser * (1 - gamma * q))

    def predict(self, n: int, f: int, beta: float | None = None, gamma: float | None = None) -> float:
        """The model's samples/s (measured points not substituted)."""
        if n <= 0:
            return 0.0
        b, g = (self.beta if beta is None else beta), (self.gamma if gamma is None else gamma)
        return float(self.curve.rate(n) * self._factor(np.array([n]), f, b, g)[0])

    def speedups(self, ns: np.ndarray, f: int) -> np.ndarray:
        """P(n, f) / P(n, 0) for sizes ``ns`` (1 where n = 0); measured points as measured."""
        ns = np.asarray(ns, dtype=np.int64)
        if f == 0:
            return np.ones(len(ns))
        out = self._factor(ns, f, self.beta, self.gamma)
        base = self.curve.table(max(int(ns.max(initial=0)), 1))
        for (n, lv), r in self.profile.points.items():
            if lv == f and n < len(base):
                out[ns == n] = r / base[n]
        return np.where(ns > 0, out, 1.0)

    def speedup(self, n: int, f: int) -> float:
        """P(n, f) / P(n, 0)."""
        return float(self.speedups(np.array([n]), f)[0])

    def rate(self, n: int, f: int) -> float:
        return self.curve.rate(n) * self.speedup(n, f) if n > 0 else 0.0

    def heldout_mape(self) -> float | None:
        """Mean absolute percentage error predicting each measured frozen point from a fit without it."""
        pts = self.profile.points
        if len(pts) < 2:
            return None
        errs = []
        for key, r in pts.items():
            b, g = self._fit({k: v for k, v in pts.items() if k != key})
            errs.append(abs(self.predict(key[0], key[1], b, g) - r) / r)
        return float(np.mean(errs))


# --- penalty -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradStats:
    """Per-layer gradient L1 norms summed over the last two recording intervals (input-to-output order); a
    frozen layer keeps its values from before it was frozen, one frozen before it had any is nan."""

    prev: tuple[float, ...]
    now: tuple[float, ...]

    @classmethod
    def from_dict(cls, d: dict | None) -> "GradStats | None":
        """From a fragment's report (train/freezing.py): None until two intervals are complete."""
        if not d or not d.get("prev") or not d.get("now"):
            return None
        return cls(tuple(float(x) for x in d["prev"]), tuple(float(x) for x in d["now"]))

    def plasticity(self) -> np.ndarray:
        prev, now = np.array(self.prev), np.array(self.now)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(prev > 0, np.abs(prev - now) / prev, np.inf)


def penalty_curve(stats: GradStats | None, n_layers: int) -> np.ndarray:
    """penalty[k] = progress lost with the first k layers frozen, k = 0..n_layers-1 (see the module doc).
    Layers without statistics (frozen before, or none yet) cost their whole share: unknown is not free."""
    out = np.ones(n_layers)
    out[0] = 0.0
    if stats is None or len(stats.now) != n_layers:
        return out
    now = np.array(stats.now)
    r = stats.plasticity()
    known = np.isfinite(r) & np.isfinite(now)
    if not known.any() or not np.nansum(now[known]) > 0:
        return out
    share = np.where(known, now, 0.0) / np.nansum(now[known])
    med = float(np.median(r[known]))
    cost = np.where(known, share * np.minimum(1.0, r / med if med > 0 else np.where(r > 0, 1.0, 0.0)), 1.0)
    return np.minimum(1.0, np.concatenate([[0.0], np.cumsum(cost)[:-1]]))


def allowed_levels(spec, current: int, penalty: np.ndarray, spent: float, remaining_share: float,
                   levels: list[int]) -> list[int]:
    """Levels a job may run at next: those within its budget if it stayed there to the end, and only up unless it
    may unfreeze - but the budget comes first: a job whose current level no longer fits (the penalty of a frozen
    prefix grows as the rest of the model settles and the prefix's share of the learning rises) goes down to
    the highest level that does (level 0 always does: it costs nothing)."""
    if spec.freeze == "off":
        return [0]

    def fits(f: int, margin: float) -> bool:
        return f == 0 or spent + margin * penalty[f] * remaining_share <= spec.accuracy_budget + 1e-12

    # a new level needs twice the headroom a held one does, so a job the budget took down does not go straight
    # back up at the next report (each change restarts it)
    ok = [f for f in levels if fits(f, 1.0 if f == current else UP_MARGIN)]
    up = [f for f in ok if f >= current or spec.unfreeze]
    return up or [max(ok)]


@dataclass
class FreezeChoice:
    """For one job, per size: the best level, its effective-rate factor P(n, f) (1 - penalty(f)) / P(n, 0), and
    that factor at the job's current level (None when the budget no longer allows it: the job must change)."""

    level: np.ndarray
    factor: np.ndarray
    current: np.ndarray | None


def best_levels(job, sizes: np.ndarray, model: LayerThroughput | None) -> FreezeChoice:
    """The level that maximises effective progress at each size (ties: the lower level)."""
    k = len(sizes)
    if model is None or (job.spec.freeze == "off" and not job.freeze):
        return FreezeChoice(np.full(k, job.freeze, dtype=np.int64), np.ones(k), np.ones(k))
    pen = penalty_curve(GradStats.from_dict(job.grad_stats), model.profile.n_layers)

    def factor(f: int) -> np.ndarray:
        return model.speedups(sizes, f) * (1 - pen[f])

    share = job.remaining / job.spec.samples
    levels = allowed_levels(job.spec, job.freeze, pen, job.accuracy_spent, share, model.profile.levels)
    best_f = np.zeros(k, dtype=np.int64)
    best_x = np.full(k, -np.inf)
    for f in levels:
        x = factor(f)
        better = x > best_x + 1e-12
        best_f[better], best_x[better] = f, x[better]
    return FreezeChoice(best_f, best_x, factor(job.freeze) if job.freeze in levels else None)


def heldout_errors(rows: list[tuple]) -> dict[str, float | None]:
    """Per model, ``LayerThroughput.heldout_mape`` of scaling rows with freeze columns
    ((model, nodes, samples/s, freeze, layers, frozen_compute, frozen_params), as ``write_scaling_csv`` takes)."""
    out = {}
    for model in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == model]
        curve = ScalingCurve(model, {r[1]: r[2] for r in mine if r[3] == 0})
        prof = LayerProfile(model, mine[0][4], {r[3]: (r[5], r[6]) for r in mine if r[3]},
                            {(r[1], r[3]): r[2] for r in mine if r[3]})
        out[model] = LayerThroughput(curve, prof).heldout_mape()
    return out


def charge_budget(job, progress_share: float) -> None:
    """Spend a job's accuracy budget for ``progress_share`` of its run trained at its current level (the
    simulator as it advances, the runtime when a fragment reports)."""
    if job.freeze and job.layers is not None and progress_share > 0:
        pen = penalty_curve(GradStats.from_dict(job.grad_stats), job.layers.profile.n_layers)
        job.accuracy_spent += float(pen[job.freeze]) * progress_share
