"""Measure a workload's scaling and rescale overheads; write the ``*.scaling.csv`` the planner reads."""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..scaling import write_scaling_csv
from .fragment import FragmentConfig
from .launcher import run_fragment


@dataclass
class ProfilePoint:
    ranks: int
    samples_per_sec: float
    restore_s: float
    rendezvous_s: float
    checkpoint_s: float
    launch_s: float          # whole fragment wall time minus training: process start, restore, rendezvous, save


def profile(workload: str, ranks: list[int], *, steps: int = 20, global_batch: int = 64, workload_args=None,
            freeze_layers: int = 0, progress=None) -> list[ProfilePoint]:
    """For each rank count: one warm-up fragment (creates a checkpoint), then a measured fragment that restores
    it, as every fragment after a rescale does."""
    out = []
    for i, n in enumerate(ranks):
        d = Path(tempfile.mkdtemp(prefix="parsl-bft-profile-"))
        try:
            base = dict(job="profile", workload=workload, checkpoint_dir=str(d), world_size=n,
                        global_batch=global_batch, workload_args=workload_args or {}, freeze_layers=freeze_layers,
                        fsync=False)
            run_fragment(FragmentConfig(**base, steps=2))
            t = time.perf_counter()
            r = run_fragment(FragmentConfig(**base, steps=steps))
            wall = time.perf_counter() - t
            out.append(ProfilePoint(n, r.throughput, r.restore_s, r.rendezvous_s, r.checkpoint_s, wall - r.train_s))
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if progress is not None:
            progress(i + 1)
    return out


def write_profile(path: str | Path, model: str, points: list[ProfilePoint]) -> None:
    write_scaling_csv(path, [(model, p.ranks, p.samples_per_sec) for p in points])


def rescale_costs(points: list[ProfilePoint]) -> tuple[float, float]:
    """(t_up, t_down) in seconds of lost progress: a rescale stops the fragment (checkpoint) and starts a new
    one (launch + restore + rendezvous); taken as the median over the measured sizes."""
    import statistics
    t = statistics.median(p.launch_s for p in points)
    return t, t
