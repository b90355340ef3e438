"""Layer elasticity (after IceFrog, with parsl-bft's own models): what freezing the first f layers of a model
buys in throughput, what it costs in training progress, and which level a job should run at. No Parsl here.

Layer-aware throughput. The level-0 curve P(n) gives the time of one sample, 1/P(n): a share par(n) = P(n) /
(n P(1)) of it (the parallel efficiency) is the one-node compute split n ways, the rest, ser(n), what one node
does not spend (synchronisation, waiting). (An Amdahl fit of the curve would call all time serial when two
ranks on shared cores run no faster than one; the one-rank step is compute all the same.) Freezing the first
f layers (forward shares c_f of the compute, q_f of the parameters) saves, of a sample's time,
    saved(n, f) = beta sigma_f par(n) + (gamma q_f - omega sigma_f) ser(n),   1/P(n, f) = (1 - saved) / P(n)
- sigma_f: the backward pass no longer computed, from the measured forward shares (a layer's backward ~ twice
  its forward: one for its weight gradient, one for its input gradient): the frozen prefix's whole backward, and
  the input gradient of the first layer that still trains, which nothing needs any more (the model's first layer
  never computes one):  sigma_f = (c_f + c_{f+1} - c_1) / (3 - c_1).  The first trainable layer's part is what a
  frozen-share model misses most: freezing a cheap first convolution spares the expensive second one's input
  gradient (the digits CNN: c_1 = 0.03, yet 1.2-1.4x).
- omega sigma_f ser(n): the all-reduce the spared backward was hiding (DDP overlaps them) shows. What is hidden is
  bounded by the all-reduce, which shows in the curve as ser(n) (DDP's last bucket is never hidden): the more
  backward is spared, the more of it shows (never more than the backward it hid under). This is why freezing
  pays less on several nodes (the public BERT profile: 2.26x on one GPU, 1.35x on 2 x 4 GPUs, synchronisation no
  shorter), and nearly as much on two ranks that scale well as on one: it depends on placement through the
  curve, not only on the shares. A negative omega is waiting that shrinks with compute (ranks on shared cores
  wait for the slowest).
beta, gamma and omega are fitted (least squares, linear) on the measured (n, f) points; a parameter the points
cannot determine (no multi-rank point: gamma, omega) keeps its prior, fitted to the public BERT profile
(``BERT_PROFILE``: gamma 0, as its synchronisation did not shrink). Measured points are used as they are, the
model fills the gaps; ``LayerThroughput.heldout`` predicts each measured point from a fit without it.

Frozen penalty. Fragments record, per layer and interval of steps (train/freezing.py), the signal share of its
gradient, rho_i = |mu_i|^2 / (|mu_i|^2 + sigma_i^2): the part that points the same way from step to step, as
opposed to minibatch noise that cancels, and the mean gradient energy E_i = |mu_i|^2 + sigma_i^2. SGD's progress
(its first-order loss decrease) from a layer is lr |mu_i|^2 = lr rho_i E_i; its noise moves the layer nowhere.
Its noise is not progress, but not nothing either: a layer whose gradient is all noise still settles as the
step size decays (what the last epochs of a decaying schedule gain), and freezing it stops that. Freezing the
first k layers loses
    penalty(k) = sum_{i<k} (rho_i + ANNEAL (1 - rho_i)) E_i / sum_j E_j
of what the optimizer does, with rho_i the larger of the last two intervals' (a settled layer must be quiet in
both: one quiet interval may be noise). A settled layer costs ANNEAL of its share of the gradient energy: cheap
when its share is small (a CNN's first convolutions), not when it carries most of the gradient (the layers of
a transformer, whose signal an interval does not resolve, yet whose freezing loses 0.5-6 points).
Statistics without the signal (reports that carry only the L1 norms) fall back to AutoFreeze's rate of change
of the per-layer L1 norms, r_i = |g_prev - g_now| / g_prev: penalty(k) = sum_{i<k} share_i * min(1, r_i / median
r). Effective progress = P(n, f) * (1 - penalty(f)). Calibrated on real data by benchmarks/freeze_calibration.py
(docs/explanation/layer-elasticity.md): the signal separates the first epochs (rho 0.5-0.8) from the
noise-dominated rest; ANNEAL covers what drifts below what an interval resolves.

Budget. A job with ``accuracy_budget`` B has spent sum(penalty * samples trained at that level / samples): a
lost share of progress is counted as that much accuracy (conservative: accuracy gains little from the last
part of a run). A level is allowed only if staying at it to the end keeps the spend within B (spent + penalty *
remaining share; a change of level needs twice that headroom, so levels do not flap); levels only go up unless
the job allows unfreezing, or its level no longer fits the budget.
Without statistics (a job that has not trained yet) only level 0 is allowed: nothing is frozen on faith.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..scaling import LayerProfile, ScalingCurve

if TYPE_CHECKING:
    from ..jobs import JobSpec
    from .problem import JobState

# priors (the model fitted to BERT_PROFILE, gamma fixed at 0: the three points cannot tell gamma from omega)
BETA0, GAMMA0, OMEGA0 = 0.92, 0.0, 1.2
# the public BERT profile (../shared/notes/layer-elasticity.md; batch 8 per GPU): GPUs -> (s/step unfrozen, with
# 72 of 80 atomic layers frozen). Shares assumed: layers of equal compute, the embeddings (~20% of the
# parameters, ~1% of the compute) first.
BERT_PROFILE = {1: (0.259, 0.115), 8: (0.327, 0.243), 16: (0.347, 0.255)}
ANNEAL = 0.1       # of a layer's noise energy share, what freezing it loses (benchmarks/freeze_calibration.py)
UP_MARGIN = 2.0                    # headroom a level change needs, in multiples of its projected spend


def saved_backward(shares: dict[int, tuple[float, float]], n_layers: int) -> dict[int, float]:
    """level -> sigma_f, the share of a training step's compute freezing the first f layers spares (module doc).
    A level whose next level's share is unknown (not measured) counts no input gradient for its first trainable
    layer; the fitted beta absorbs what that misses."""
    c = {f: cf for f, (cf, _) in shares.items()}
    c.setdefault(n_layers, 1.0)
    c1 = c.get(1, 0.0)
    return {f: (c[f] + c.get(f + 1, c[f]) - c1) / (3 - c1) if f else 0.0 for f in shares}


@dataclass
class LayerThroughput:
    """Samples/s at (nodes, freeze level) from a model's level-0 curve and its measured layer profile."""

    curve: ScalingCurve
    profile: LayerProfile
    beta: float = field(init=False)
    gamma: float = field(init=False)
    omega: float = field(init=False)

    def __post_init__(self) -> None:
        self._sigma = saved_backward(self.profile.shares, self.profile.n_layers)
        self.beta, self.gamma, self.omega = self._fit(self.profile.points)
        self._table = np.ones((0, 0))      # [level, nodes] -> speedup, built on first use (the planner's hot path)

    def _split(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shares of a sample's time on n nodes that is the one-node compute split n ways, par(n) = P(n) / (n P(1))
        (the parallel efficiency), and that one node does not spend (synchronisation, waiting), 1 - par(n)."""
        n = np.maximum(np.asarray(n, dtype=np.int64), 1)
        rates = self.curve.table(int(n.max()))
        par = np.minimum(rates[n] / (n * rates[1]), 1.0)
        return par, 1.0 - par

    def _columns(self, ns: np.ndarray, fs: Sequence[int]) -> np.ndarray:
        """saved(n, f) = columns @ (beta, gamma, omega)."""
        sigma = np.array([self._sigma[f] for f in fs])
        q = np.array([self.profile.shares[f][1] for f in fs])
        par, ser = self._split(ns)
        return np.column_stack([sigma * par, q * ser, -sigma * ser])

    def _fit(self, points: dict[tuple[int, int], float]) -> tuple[float, float, float]:
        if not points:
            return BETA0, GAMMA0, OMEGA0
        ns = np.array([n for n, _ in points])
        a = self._columns(ns, [f for _, f in points])
        base = np.array([self.curve.rate(int(n)) for n in ns])
        saved = 1.0 - base / np.array(list(points.values()))       # share of the level-0 time saved
        x = np.array([BETA0, GAMMA0, OMEGA0])
        lo = np.array([0.0, 0.0, -3.0])
        hi = np.array([1.0 / max(max(self._sigma.values()), 1e-9), 1.0, 3.0])   # beta: never a negative time
        free = np.any(a != 0, axis=0)          # a parameter no point depends on keeps its prior
        for _ in range(3):                     # one out of bounds is held at its bound, the others refitted
            x[free] = np.linalg.lstsq(a[:, free], saved - a[:, ~free] @ x[~free], rcond=None)[0]
            out = free & ((x < lo) | (x > hi))
            if not out.any():
                break
            x = np.clip(x, lo, hi)
            free &= ~out
        x = np.clip(x, lo, hi)
        return float(x[0]), float(x[1]), float(x[2])

    def _factor(self, ns: np.ndarray, f: int, params: tuple[float, float, float]) -> np.ndarray:
        """The model's P(n, f) / P(n, 0) (measured points not substituted)."""
        spared, sync, shown = (self._columns(ns, [f] * len(ns)) * np.array(params)).T
        # what the spared backward hid cannot cost more than the backward did
        saved = spared + sync + np.maximum(shown, -spared)
        return 1.0 / np.maximum(1.0 - saved, 1e-3)

    @property
    def params(self) -> tuple[float, float, float]:
        """The fitted (beta, gamma, omega) of the throughput model."""
        return self.beta, self.gamma, self.omega

    def predict(self, n: int, f: int, params: tuple[float, float, float] | None = None) -> float:
        """The model's samples/s (measured points not substituted)."""
        if n <= 0:
            return 0.0
        return float(self.curve.rate(n) * self._factor(np.array([n]), f, params or self.params)[0])

    def speedups(self, ns: np.ndarray, f: int) -> np.ndarray:
        """P(n, f) / P(n, 0) for sizes ``ns`` (1 where n = 0); measured points as measured. Looked up in a table
        of every level and size up to the largest asked (the curve and the profile do not change)."""
        ns = np.asarray(ns, dtype=np.int64)
        if f == 0:
            return np.ones(len(ns))
        top = int(ns.max(initial=0))
        if top >= self._table.shape[1] and f in self._sigma:
            size = max(top + 1, 2 * self._table.shape[1], 64)
            every = np.arange(size)
            self._table = np.ones((self.profile.n_layers, size))
            for lv in self._sigma:
                if lv:
                    self._table[lv] = self._computed(every, lv)
        return self._table[f][ns] if f in self._sigma else self._computed(ns, f)

    def _computed(self, ns: np.ndarray, f: int) -> np.ndarray:
        """``speedups`` computed (f >= 1)."""
        out = self._factor(ns, f, self.params)
        base = self.curve.table(max(int(ns.max(initial=0)), 1))
        for (n, lv), r in self.profile.points.items():
            if lv == f and n < len(base):
                out[ns == n] = r / base[n]
        return np.where(ns > 0, out, 1.0)

    def speedup(self, n: int, f: int) -> float:
        """P(n, f) / P(n, 0)."""
        if f == 0 or n <= 0:
            return 1.0
        if n < self._table.shape[1] and f in self._sigma:
            return float(self._table[f, n])
        return float(self.speedups(np.array([n]), f)[0])

    def rate(self, n: int, f: int) -> float:
        """Samples/s on ``n`` nodes with the first ``f`` layers frozen."""
        return self.curve.rate(n) * self.speedup(n, f) if n > 0 else 0.0

    def heldout(self) -> dict[tuple[int, int], tuple[float, float]]:
        """(nodes, level) -> (measured, predicted by a fit without that point), for every measured frozen point."""
        pts = self.profile.points
        if len(pts) < 2:
            return {}
        return {key: (r, self.predict(*key, self._fit({k: v for k, v in pts.items() if k != key})))
                for key, r in pts.items()}

    def heldout_mape(self) -> float | None:
        """Mean absolute percentage error predicting each measured frozen point from a fit without it."""
        h = self.heldout()
        return float(np.mean([abs(p - r) / r for r, p in h.values()])) if h else None


# --- penalty -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradStats:
    """Per-layer gradient statistics of the last recording intervals (input-to-output order; train/freezing.py's
    GradRecorder): L1 norms summed over the previous and the last interval, and (when the recorder measured them)
    the signal share of the last two intervals' gradients and their mean energy in the last one. A frozen layer
    keeps its values from before it was frozen; one frozen before it had any is nan."""

    prev: tuple[float, ...]
    now: tuple[float, ...]
    signal: tuple[float, ...] | None = None
    signal_prev: tuple[float, ...] | None = None
    energy: tuple[float, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> GradStats | None:
        """From a fragment's report: None until two intervals are complete."""
        if not d or not d.get("prev") or not d.get("now"):
            return None

        def vec(k: str) -> tuple[float, ...] | None:
            return tuple(float(x) for x in d[k]) if d.get(k) and len(d[k]) == len(d["now"]) else None
        # prev and now were checked present above; the recorder reports them for the same layers
        return cls(cast(tuple[float, ...], vec("prev")), cast(tuple[float, ...], vec("now")), vec("signal"),
                   vec("signal_prev"), vec("energy"))

    def plasticity(self) -> np.ndarray:
        """Per layer: how much its gradient's L1 norm changed between the two intervals, relative (inf: none
        before)."""
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
    if stats.signal is not None and stats.energy is not None:
        rho, energy = np.array(stats.signal), np.array(stats.energy)
        if stats.signal_prev is not None:      # settled only when neither interval showed a consistent pull:
            rho = np.maximum(rho, np.array(stats.signal_prev))     # one quiet interval may be noise
        known = np.isfinite(rho) & np.isfinite(energy)
        if not known.any() or not energy[known].sum() > 0:
            return out
        # the consistent part of a layer's gradient, as a share of all the gradient the optimizer follows, is
        # what freezing it loses; of its noise, ANNEAL: what the layer would still settle as the step size decays
        rho = np.clip(rho, 0.0, 1.0)
        cost = np.where(known, (rho + ANNEAL * (1 - rho)) * np.where(known, energy, 0.0) / energy[known].sum(), 1.0)
    else:      # statistics without the signal (L1 norms only): the rate of change of the L1 norms
        now = np.array(stats.now)
        r = stats.plasticity()
        known = np.isfinite(r) & np.isfinite(now)
        if not known.any() or not np.nansum(now[known]) > 0:
            return out
        share = np.where(known, now, 0.0) / np.nansum(now[known])
        med = float(np.median(r[known]))
        cost = np.where(known, share * np.minimum(1.0, r / med if med > 0 else np.where(r > 0, 1.0, 0.0)), 1.0)
    return np.minimum(1.0, np.concatenate([[0.0], np.cumsum(cost)[:-1]]))


_PENALTIES: dict[int, tuple[dict[str, Any], int, np.ndarray]] = {}


def job_penalty(stats: dict[str, Any] | None, n_layers: int) -> np.ndarray:
    """``penalty_curve`` of a job's reported statistics, computed once per report: the planner asks at every
    plan and the simulator at every step, and a report is a new dict each time (never changed in place)."""
    if not stats:
        return penalty_curve(None, n_layers)
    hit = _PENALTIES.get(id(stats))
    if hit is not None and hit[0] is stats and hit[1] == n_layers:
        return hit[2]
    pen = penalty_curve(GradStats.from_dict(stats), n_layers)
    pen.setflags(write=False)
    if len(_PENALTIES) >= 4096:           # a report's entry keeps it alive (its id cannot be reused meanwhile)
        _PENALTIES.clear()
    _PENALTIES[id(stats)] = (stats, n_layers, pen)
    return pen


def allowed_levels(spec: JobSpec, current: int, penalty: np.ndarray, spent: float, remaining_share: float,
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


def best_levels(job: JobState, sizes: np.ndarray, model: LayerThroughput | None) -> FreezeChoice:
    """The level that maximises effective progress at each size (ties: the lower level)."""
    k = len(sizes)
    if model is None or (job.spec.freeze == "off" and not job.freeze):
        return FreezeChoice(np.full(k, job.freeze, dtype=np.int64), np.ones(k), np.ones(k))
    pen = job_penalty(job.grad_stats, model.profile.n_layers)

    def factor(f: int) -> np.ndarray:
        return model.speedups(sizes, f) * (1 - pen[f])

    levels = allowed_levels(job.spec, job.freeze, pen, job.accuracy_spent, job.untrained_share,
                            model.profile.levels)
    best_f = np.zeros(k, dtype=np.int64)
    best_x = np.full(k, -np.inf)
    for f in levels:
        x = factor(f)
        better = x > best_x + 1e-12
        best_f[better], best_x[better] = f, x[better]
    return FreezeChoice(best_f, best_x, factor(job.freeze) if job.freeze in levels else None)


def heldout_errors(rows: list[tuple[Any, ...]]) -> dict[str, float | None]:
    """Per model, ``LayerThroughput.heldout_mape`` of scaling rows with freeze columns
    ((model, nodes, samples/s, freeze, layers, frozen_compute, frozen_params), as ``write_scaling_csv`` takes)."""
    out: dict[str, float | None] = {}
    for model in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == model]
        curve = ScalingCurve(model, {r[1]: r[2] for r in mine if r[3] == 0})
        prof = LayerProfile(model, mine[0][4], {r[3]: (r[5], r[6]) for r in mine if r[3]},
                            {(r[1], r[3]): r[2] for r in mine if r[3]})
        out[model] = LayerThroughput(curve, prof).heldout_mape()
    return out


def charge_budget(job: JobState, progress_share: float) -> None:
    """Spend a job's accuracy budget for ``progress_share`` of its run trained at its current level (the
    simulator as it advances, the runtime when a fragment reports)."""
    if job.freeze and job.layers is not None and progress_share > 0:
        pen = job_penalty(job.grad_stats, job.layers.profile.n_layers)
        job.accuracy_spent += float(pen[job.freeze]) * progress_share
