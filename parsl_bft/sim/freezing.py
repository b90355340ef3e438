"""Freeze profiles for the simulator: how a job's layers settle as it trains, so the planner's penalty model
(planner/freeze.py) sees statistics like those fragments record (train/freezing.py's GradRecorder), and budgets
can be checked.

A profile is parsl-bft's own synthetic model. Layer i's gradient is a consistent pull mu_i plus minibatch noise
of energy n_i (its share of the model's parameters: noise energy grows with the entries); the pull fades as the
layer settles, |mu_i|^2 / n_i = exp(-x / tau_i) at progress x in [0, 1] (as strong as the noise at the start:
the digits CNN's signal share is ~0.5 early on), with tau_i = s_i / ln 19 so that the recorder's signal share
rho_i = |mu|^2 / (|mu|^2 + n_i) falls through 0.05 at x = s_i. Layers settle in input-to-output order on
PipeTransformer's default schedule (../shared/notes/layer-elasticity.md: F(T) = L (1 - (1 - 1/E)^T) of L layers
after epoch T of E, here E = 10): layer i at s_i = -ln(1 - (i+1)/L) / (-E ln(1 - 1/E)), scaled by a per-job
factor in [0.6, 1.6]; about 63% of the layers settle by the end, the last ones never. The real digits CNN
(benchmarks/freeze_calibration.py) settles sooner (every layer's signal is noise by 30% of its run): the
schedule is the conservative choice.
"""
from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..jobs import JobSpec
from ..scaling import LayerProfile

N_LAYERS = 8
EPOCHS = 10          # PipeTransformer's E
SETTLED = 0.05       # the signal share at which a layer counts as settled


@dataclass(frozen=True)
class FreezeProfile:
    """A job's synthetic layer-settling schedule (the module docstring's model), and the statistics its
    fragments would report every ``interval`` of progress."""

    settle: tuple[float, ...]        # progress at which each layer's signal share falls to SETTLED (inf: never)
    noise: tuple[float, ...]         # each layer's noise energy (its share of the parameters)
    interval: float = 0.02

    def _at(self, x: float) -> tuple[np.ndarray, np.ndarray]:
        """(signal share, energy) per layer at progress x."""
        snr = np.exp(-x * np.log(1 / SETTLED - 1) / np.array(self.settle))
        return snr / (1 + snr), np.array(self.noise) * (1 + snr)

    def stats(self, x: float) -> dict | None:
        """The statistics the job's last report holds at progress x: those of the last complete interval (None
        before two are complete), the expected values (the recorder's estimate of rho scatters around them; a
        penalty model must absorb that). One report is one dict, the same object until the next."""
        return self._report(math.floor(x / self.interval + 1e-9))

    @functools.lru_cache(maxsize=1 << 16)      # noqa: B019 (profiles are few, small and live as long as a replay)
    def _report(self, k: int) -> dict | None:
        """The report at the end of interval k (1-based)."""
        if k < 2:
            return None
        x = k * self.interval
        rho_prev, e_prev = self._at(x - self.interval)
        rho, e = self._at(x)
        return {"prev": np.sqrt(e_prev).tolist(), "now": np.sqrt(e).tolist(), "signal": rho.tolist(),
                "signal_prev": rho_prev.tolist(), "energy": e.tolist()}


def settle_schedule(n_layers: int, epochs: int = EPOCHS) -> np.ndarray:
    """Progress at which each layer settles on PipeTransformer's default schedule (inf: never)."""
    i = np.arange(1, n_layers + 1)
    with np.errstate(divide="ignore"):
        return -np.log(1 - i / n_layers) / (-epochs * np.log(1 - 1 / epochs))


def synthetic_profile(job: JobSpec, n_layers: int = N_LAYERS, seed: int = 0) -> FreezeProfile:
    """A job's profile, its pace drawn from its name (the same job always settles the same way)."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{job.name}".encode()).digest()[:8], "little")
    jitter = np.random.default_rng(h).uniform(0.6, 1.6)
    shares = synthetic_layers(job.model, n_layers).shares
    q = np.array([shares.get(k, (1.0, 1.0))[1] for k in range(n_layers + 1)])
    return FreezeProfile(tuple(float(s) for s in settle_schedule(n_layers) * jitter),
                         tuple(float(x) for x in np.maximum(np.diff(q), 1e-3)))


def synthetic_layers(model: str, n_layers: int = N_LAYERS) -> LayerProfile:
    """Frozen shares of a CNN-like model: compute sits in the early layers, parameters in the late ones
    (ResNets: the first quarter of the layers does ~40% of the FLOPs and holds ~5% of the weights)."""
    f = np.arange(n_layers) / n_layers
    compute = 1 - (1 - f) ** 1.5
    params = f ** 2.5
    return LayerProfile(model, n_layers, {k: (float(compute[k]), float(params[k])) for k in range(1, n_layers)})
