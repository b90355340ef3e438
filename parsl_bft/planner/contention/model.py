"""The ring-all-reduce cost model of SJF-BCO (Yu et al., MobiHoc 2022, eqs. 6-8), vectorised over jobs.

A job of w workers on GPUs of one or more servers exchanges its gradient of size m by ring all-reduce every
iteration. Inside one server it gets the intra-server bandwidth b_i; split over servers it gets the
inter-server bandwidth b_e divided by the degradation f(alpha, k) of its effective contention k = xi1 * p, where
p (eq. 6) is the largest number of active split jobs on any server it is split on. Per-iteration time (eq. 8):

    tau = (m / w) * 2 (w - 1) / B + (m / w) * (w - 1) / C + xi2 * overhead * servers + compute

At node granularity (one job per node, idle supercomputer nodes) the same model reads "server" as "group"
(rack / leaf switch / dragonfly group) and "GPU" as node; ``parsl_bft.topology`` names the groups.
Units are the caller's, as long as they agree: gradient size / bandwidth and the other terms are in slots
(seconds at node granularity).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import BadValue


@dataclass(frozen=True)
class CommParams:
    """Parameters of eqs. 6-8 (names as in the paper). The paper leaves their values open; these defaults
    are ours: b_i / b_e = 10 (NVLink vs a shared NIC), a linear degradation (alpha = 1), jobs that transmit all
    the time (xi1 = 1) and a per-server overhead of 1e-3 slots per iteration (xi2 = 1)."""

    alpha: float = 1.0          # f(alpha, k) = k + alpha (k - 1): extra slowdown per extra contender
    xi1: float = 1.0            # effective contention k = xi1 * p (jobs do not transmit all the time), (0, 1]
    xi2: float = 1.0            # overhead gamma = xi2 * overhead * servers spanned, (0, 1]
    b_intra: float = 10.0       # b_i: intra-server bandwidth (gradient units per slot)
    b_inter: float = 1.0        # b_e: inter-server bandwidth with no contention
    reduce_speed: float = 100.0  # C: rate at which a GPU reduces received gradient data
    overhead: float = 1e-3      # slots per iteration per server spanned (scaled by xi2)
    max_extra: float | None = None  # contention + overhead add at most this share of the one-server time

    def __post_init__(self) -> None:
        for name in ("b_intra", "b_inter", "reduce_speed"):
            if not getattr(self, name) > 0:
                raise BadValue(f"CommParams.{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.xi1 <= 1 or not 0 < self.xi2 <= 1:
            raise BadValue(f"CommParams: xi1 and xi2 must be in (0, 1], got {self.xi1}, {self.xi2}")
        if self.max_extra is not None and not self.max_extra >= 0:
            raise BadValue(f"CommParams.max_extra must be >= 0 or None, got {self.max_extra}")
        if self.alpha < 0 or self.overhead < 0:
            raise BadValue(f"CommParams: alpha and overhead must be >= 0, got {self.alpha}, {self.overhead}")


def degradation(k, alpha: float) -> np.ndarray:
    """f(alpha, k) = k + alpha (k - 1), never below 1: a link is not faster than uncontended (k = xi1 p < 1 when
    xi1 < 1 and the job is alone on its links; the paper's f(alpha, 1) = 1 is the floor)."""
    k = np.asarray(k, dtype=float)
    return np.maximum(1.0, k + alpha * (k - 1.0))


def contention(split: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
    """Eq. 6. ``split[j, s]``: job j is split on server s (0 < y_js < G_j). Returns p_j for every job: the most
    active split jobs on any server j is split on (itself included); 0 for a job inside one server. ``active``
    (bool per job) says who runs now; inactive jobs neither count nor are counted (their p is 0)."""
    split = np.asarray(split, dtype=bool)
    act = np.ones(len(split), bool) if active is None else np.asarray(active, bool)
    on = split & act[:, None]
    per_server = on.sum(axis=0)
    return np.where(on, per_server[None, :], 0).max(axis=1, initial=0)


def iteration_time(workers, servers, p, grad, compute, params: CommParams) -> np.ndarray:
    """Eq. 8, per job (arrays broadcast): ``workers`` w, ``servers`` spanned, contention count ``p`` (eq. 6),
    gradient size ``grad`` m, ``compute`` = forward + backward time dF M + dB. With ``params.max_extra`` set,
    the time is at most (1 + max_extra) times the job's contention-free time (inside one server, p = 0): the
    paper's "contention and overhead add at most 15%" read as a cap."""
    w = np.asarray(workers, dtype=float)
    s = np.asarray(servers, dtype=float)
    m = np.asarray(grad, dtype=float)
    k = params.xi1 * np.asarray(p, dtype=float)
    bw = np.where(s <= 1, params.b_intra, params.b_inter / degradation(k, params.alpha))
    share = np.where(w > 1, (m / np.maximum(w, 1.0)) * (w - 1.0), 0.0)
    tail = share / params.reduce_speed + np.asarray(compute, dtype=float)
    tau = 2.0 * share / bw + params.xi2 * params.overhead * np.maximum(s, 1.0) + tail
    if params.max_extra is None:
        return tau
    free = 2.0 * share / params.b_intra + params.xi2 * params.overhead + tail
    return np.minimum(tau, (1.0 + params.max_extra) * free)


def iterations_per_slot(tau) -> np.ndarray:
    """floor(1 / tau) (the paper's slotted progress), at least 1: a job slower than a slot per iteration still
    advances (the paper's instances never get there)."""
    return np.maximum(1, np.floor(1.0 / np.asarray(tau, dtype=float) + 1e-9)).astype(np.int64)
