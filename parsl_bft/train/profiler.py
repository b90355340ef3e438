"""Measure a workload's scaling and rescale overheads; write the ``*.scaling.csv`` the planner reads."""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from ..scaling import write_scaling_csv
from .fragment import FragmentConfig
from .launcher import run_fragment


@dataclass
class ProfilePoint:
    """One measurement: samples/s on ``ranks`` ranks with ``freeze`` layers frozen, and what the fragment spent
    around its training (restore, rendezvous, the final save, launching)."""

    ranks: int
    samples_per_sec: float
    restore_s: float
    rendezvous_s: float
    checkpoint_s: float
    launch_s: float          # whole fragment wall time minus training: process start, restore, rendezvous, save
    freeze: int = 0          # layers frozen while measuring


def measure_layer_shares(workload: str, global_batch: int = 64, workload_args: dict[str, Any] | None = None
                         ) -> tuple[int, dict[int, tuple[float, float]]]:
    """(number of layers, level -> (frozen share of compute, of parameters)) of a workload's model."""
    from torch.utils.data import TensorDataset

    from .freezing import layer_shares
    from .workloads import make_workload

    wl = make_workload(workload, **(workload_args or {}))
    data = wl.dataset()
    model = wl.build_model()
    blocks = wl.blocks(model)
    n = min(global_batch, len(cast(Sized, data)))      # a workload's dataset is map-style: it has a length
    batch = data[list(range(n))] if isinstance(data, TensorDataset) else wl.collate([data[i] for i in range(n)])
    return len(blocks), layer_shares(model, blocks, batch, wl.loss)


def profile(workload: str, ranks: list[int], *, steps: int = 20, global_batch: int = 64,
            workload_args: dict[str, Any] | None = None, freeze_layers: int = 0,
            freeze_levels: list[int] | None = None,
            progress: Callable[[int], object] | None = None) -> list[ProfilePoint]:
    """For each rank count (and freeze level: ``freeze_levels``, else ``freeze_layers`` alone): one warm-up
    fragment (creates a checkpoint), then a measured fragment that restores it, as every fragment after a
    rescale does."""
    out = []
    configs = [(n, f) for f in (freeze_levels or [freeze_layers]) for n in ranks]
    for i, (n, freeze_layers) in enumerate(configs):
        d = Path(tempfile.mkdtemp(prefix="parsl-bft-profile-"))
        try:
            warm_up = FragmentConfig(job="profile", workload=workload, checkpoint_dir=str(d), world_size=n,
                                     global_batch=global_batch, workload_args=workload_args or {},
                                     freeze_layers=freeze_layers, fsync=False, steps=2)
            run_fragment(warm_up)
            t = time.perf_counter()
            r = run_fragment(replace(warm_up, steps=steps))
            wall = time.perf_counter() - t
            assert r is not None                # every rank ran here: rank 0's result
            out.append(ProfilePoint(n, r.throughput, r.restore_s, r.rendezvous_s, r.checkpoint_s, wall - r.train_s,
                                    freeze_layers))
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if progress is not None:
            progress(i + 1)
    return out


def write_profile(path: str | Path, model: str, points: list[ProfilePoint],
                  layers: tuple[int, dict[int, tuple[float, float]]] | None = None) -> None:
    """The ``*.scaling.csv``; with ``layers`` (``measure_layer_shares``) every row carries its freeze level and
    frozen shares (the planner chooses among the measured levels and predicts their unmeasured sizes)."""
    if layers is None:
        write_scaling_csv(path, [(model, p.ranks, p.samples_per_sec) for p in points])
        return
    n_layers, shares = layers
    write_scaling_csv(path, [(model, p.ranks, p.samples_per_sec, p.freeze, n_layers, *shares[p.freeze])
                             for p in points])


def rescale_costs(points: list[ProfilePoint]) -> tuple[float, float]:
    """(t_up, t_down) in seconds of lost progress: a rescale stops the fragment (checkpoint) and starts a new
    one (launch + restore + rendezvous); taken as the median over the measured sizes."""
    import statistics
    t = statistics.median(p.launch_s for p in points)
    return t, t
