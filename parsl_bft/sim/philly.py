"""A dedicated GPU cluster with job arrivals from Microsoft's Philly trace (2017; the job table Pollux's authors
published): IceFrog's setting, next to parsl-bft's own (idle supercomputer nodes)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
from pathlib import Path

import numpy as np

from ..csvio import parse_number, read_rows
from ..errors import BadRows, BadValue, InputError
from ..idle.intervals import IdleIntervals
from ..idle.swf import MAX_NODES
from ..jobs import JobSet, JobSpec
from ..scaling import ScalingCurve
from .freezing import synthetic_layers

PHILLY_COLUMNS = ["timestamp", "duration", "num_gpus"]


def dedicated_cluster(n: int, t0: float, t1: float) -> IdleIntervals:
    """n nodes, all free from t0 to t1: the simulator's input for a cluster that runs only these jobs."""
    if not 1 <= n <= MAX_NODES:      # per-node arrays: 1e10 nodes exhausted the memory
        raise BadValue(f"--cluster needs 1 to {MAX_NODES:,} nodes, got {n:,}")
    return IdleIntervals.build([f"node{i}" for i in range(n)], np.arange(n), np.full(n, t0), np.full(n, t1), t0, t1,
                               source=f"dedicated cluster of {n} nodes")


def read_philly(path: str | Path, curves: dict[str, ScalingCurve], *, n_jobs: int = 500, start: str = "2017-10-02",
                days: float = 4.0, max_gpus: int = 48, load: float | None = None, freeze_share: float = 0.6,
                accuracy_budget: float = 0.005, max_duration: float = 12 * 3600, t_restart: float = 15.0,
                seed: int = 0, rigid: bool = False) -> JobSet:
    """``n_jobs`` jobs drawn at random (``seed``) from those arriving in ``days`` days from ``start`` (UTC) that ask
    for at most ``max_gpus`` GPUs, as elastic jobs. The trace is the whole of Philly (thousands of GPUs): the draw
    thins its arrivals, to an offered load of ~0.2 on 48 GPUs with the defaults (a cluster idle 80% of the time,
    where no scheduler matters). ``load``: compress (or stretch) the arrival times, burstiness kept, so that the
    jobs' work in single-GPU seconds is ``load`` x what ``max_gpus`` GPUs offer between the first and the last
    arrival (``offered_load`` measures it; arrivals all at one moment are left as they are).

    A job keeps its arrival (seconds after the first) and its work: what it did in ``duration`` seconds (capped
    at ``max_duration``) on its ``num_gpus`` GPUs, at the rate of a model drawn from ``curves``. It may run on
    1 .. 2 x num_gpus nodes (one node = one GPU here); ``rigid``: on exactly num_gpus (the baseline schedulers
    of ``sim.baselines``; the same draw otherwise). A ``freeze_share`` of the jobs, drawn at random, allows
    freezing (``freeze="auto"`` within ``accuracy_budget``); each model gets ``synthetic_layers``.
    """
    if load is not None and not 0 < load < math.inf:
        raise BadValue(f"load must be > 0 (the jobs' single-GPU seconds / the cluster's GPU-seconds over the "
                       f"arrival span), got {load}")
    p = str(path)
    bad = BadRows(False)
    rows = []
    t0 = dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC).timestamp()
    for line, row in read_rows(path, PHILLY_COLUMNS, bad):
        try:
            t = dt.datetime.fromisoformat(row["timestamp"]).replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            raise InputError(p, line, "timestamp", f"not a date and time: {row['timestamp']!r}") from None
        d = parse_number(p, line, "duration", row["duration"], strictly_positive=True)
        g = int(parse_number(p, line, "num_gpus", row["num_gpus"], kind=int, minimum=1))
        if g <= max_gpus and t0 <= t < t0 + days * 86400:
            rows.append((t, d, g))
    if len(rows) < n_jobs:
        raise InputError(p, 0, None, f"{len(rows)} jobs of <= {max_gpus} GPUs arrive in {days:g} days from {start}; "
                                     f"{n_jobs} wanted")
    rng = np.random.default_rng(seed)
    rows = sorted(rows[i] for i in rng.choice(len(rows), n_jobs, replace=False))
    models = sorted(curves)
    t_first = rows[0][0]
    jobs = []
    for i, (t, d, g) in enumerate(rows):
        model = models[rng.integers(len(models))]
        freeze = rng.random() < freeze_share
        jobs.append(JobSpec(f"philly{i:04d}", model, g if rigid else 1, g if rigid else min(2 * g, max_gpus),
                            t_restart, t_restart,
                            min(d, max_duration) * curves[model].rate(g), submit=t - t_first,
                            freeze="auto" if freeze else "off", accuracy_budget=accuracy_budget if freeze else 0.0))
    js = JobSet(jobs, dict(curves), {m: synthetic_layers(m) for m in models})
    offered = offered_load(js, max_gpus)
    if load is None or offered == math.inf:
        return js
    squeeze = offered / load
    return dataclasses.replace(js, jobs=[dataclasses.replace(j, submit=j.submit * squeeze) for j in jobs])


def offered_load(jobs: JobSet, gpus: int) -> float:
    """The jobs' work in single-GPU seconds (samples / the model's one-GPU rate, as e_idle counts it) / what
    ``gpus`` GPUs offer between the first and the last submit."""
    span = max(j.submit for j in jobs.jobs) - min(j.submit for j in jobs.jobs)
    work = sum(j.samples / jobs.curves[j.model].rate(1) for j in jobs.jobs)
    return work / (gpus * span) if span > 0 else math.inf
