"""Freeze profiles for the simulator: how a job's layers settle as it trains, so the planner's penalty model
(planner/freeze.py) sees statistics like those fragments record, and budgets can be checked.

A profile is parsl-bft's own synthetic model, in line with what freezing studies report (earlier layers settle
first; a settled layer's gradient norm stops changing): layer i's gradient L1 norm at progress x in [0, 1] is
    g_i(x) = floor + exp(-x / tau_i),   tau_i = tau * (0.25 + 1.5 i / (L - 1)) * jitter,
sampled at the ends of the last two recording intervals (``interval`` of the run each), as a fragment's
``GradRecorder`` reports them.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..jobs import JobSpec
from ..scaling import LayerProfile

N_LAYERS = 8


@dataclass(frozen=True)
class FreezeProfile:
    taus: tuple[float, ...]
    floor: float = 0.2
    interval: float = 0.02

    def _g(self, x: float) -> list[float]:
        return [self.floor + float(np.exp(-x / t)) for t in self.taus]

    def stats(self, x: float) -> dict | None:
        """The statistics a fragment would report at progress x (None before two intervals are complete)."""
        if x < 2 * self.interval:
            return None
        return {"prev": self._g(x - self.interval), "now": self._g(x)}


def synthetic_profile(job: JobSpec, n_layers: int = N_LAYERS, tau: float = 0.15, seed: int = 0) -> FreezeProfile:
    """A job's profile, drawn from its name (the same job always settles the same way)."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{job.name}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(h)
    jitter = rng.uniform(0.6, 1.6)
    return FreezeProfile(tuple(tau * jitter * (0.25 + 1.5 * i / (n_layers - 1)) for i in range(n_layers)))


def synthetic_layers(model: str, n_layers: int = N_LAYERS) -> LayerProfile:
    """Frozen shares of a CNN-like model: compute sits in the early layers, parameters in the late ones
    (ResNets: the first quarter of the layers does ~40% of the FLOPs and holds ~5% of the weights)."""
    f = np.arange(n_layers) / n_layers
    compute = 1 - (1 - f) ** 1.5
    params = f ** 2.5
    return LayerProfile(model, n_layers, {k: (float(compute[k]), float(params[k])) for k in range(1, n_layers)})
