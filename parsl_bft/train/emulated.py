"""An emulated accelerator: a built-in workload whose per-rank step takes a set time, so that a machine with few
cores can measure the runtime (pilots, fragments, checkpoints, rendezvous) and not CPU contention among the
virtual nodes it emulates.

Per step each rank "computes" its share of the global batch by sleeping ``sample_ms`` per sample (a sleep
stands in for the GPU: it costs no CPU), then DDP all-reduces a real gradient of ``params_mb`` megabytes through
torch.distributed, and checkpoints are real HDF5 files of the parameters and the optimizer's momentum
(2 x ``params_mb``). Its scaling curve is known exactly: on n ranks a step takes
``sample_ms * ceil(global_batch / n)`` plus the all-reduce, so ``rate(n) = global_batch / (sample_ms/1000 *
ceil(global_batch / n))`` samples/s is what the same job trains on n dedicated nodes (``dedicated_rate``).
Every figure measured with it is an emulated accelerator's, and says so.
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from ..errors import BadValue
from .workloads import Workload


def dedicated_rate(nodes: int, global_batch: int, sample_ms: float, ranks_per_node: int = 1) -> float:
    """Samples/s of the emulated job on ``nodes`` dedicated nodes (its compute only: the exact curve)."""
    ranks = nodes * ranks_per_node
    return global_batch / (sample_ms / 1000.0 * math.ceil(global_batch / ranks))


class _Device(nn.Module):
    """One flat parameter of the set size; its forward pass sleeps for the batch it is given."""

    def __init__(self, numel: int, sample_ms: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(numel))
        self.sample_s = sample_ms / 1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sample_s * x.shape[0])
        # every element gets a gradient (the all-reduce moves all of it); its value is the batch's mean
        return (self.w * 1e-6).sum() + x.mean()


class EmulatedAccelerator(Workload):
    """The emulated accelerator (module docstring): ``sample_ms`` of sleep per sample per rank, an all-reduce and
    a checkpoint of ``params_mb`` megabytes (float32) of parameters, ``n`` items of data."""

    name = "emulated"

    def __init__(self, seed: int = 0, lr: float = 0.01, sample_ms: float = 2.5, params_mb: float = 1.0,
                 n: int = 4096, **kw: Any) -> None:
        super().__init__(seed, lr, **kw)
        if not sample_ms > 0 or not params_mb > 0 or n < 1:
            raise BadValue(f"emulated accelerator: sample_ms and params_mb must be > 0 and n >= 1, got "
                           f"sample_ms={sample_ms}, params_mb={params_mb}, n={n}")
        self.sample_ms, self.params_mb, self.n = sample_ms, params_mb, n

    def dataset(self) -> Dataset[Any]:
        """``n`` scalar items (the data is not what is measured)."""
        g = torch.Generator().manual_seed(self.seed)
        return TensorDataset(torch.rand(self.n, 1, generator=g), torch.zeros(self.n, dtype=torch.long))

    def build_model(self) -> nn.Module:
        """One parameter of ``params_mb`` MB whose forward pass sleeps ``sample_ms`` per sample."""
        return _Device(max(1, int(self.params_mb * 2**20 / 4)), self.sample_ms)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The model's output (a scalar that depends on every parameter)."""
        x, _ = batch
        out: torch.Tensor = model(x)
        return out

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """One block: nothing to freeze."""
        return [model]
