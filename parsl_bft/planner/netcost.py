"""What the network costs a data-parallel job on idle nodes: SJF-BCO's model (eqs. 6-8) one level up.

A node belongs to one job, so "server" reads "group" (rack / leaf switch / dragonfly group): a job whose nodes
sit in one group all-reduces at the intra-group bandwidth; a job spread over groups gets the inter-group
bandwidth divided by f(alpha, xi1 p), where p counts the spread jobs on the groups it touches (eq. 6), and pays
an overhead per group. Measured scaling curves are taken as measured inside one group: a placement changes a
job's iteration time by (its ring time where it is) - (its ring time inside one group), and its rate by the
inverse ratio. Nothing here imports Parsl; the planner's placement and the simulator's rate model share it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BadValue
from ..topology import Topology
from .contention.model import CommParams, contention, iteration_time

if TYPE_CHECKING:
    from .problem import JobState

# fp32 gradient of each model of the ImageNet mix (parameters x 4 bytes), GB; torchvision's parameter counts
GRADIENT_GB = {"alexnet": 0.244, "vgg16": 0.553, "resnet18": 0.047, "densenet": 0.032, "mnasnet": 0.0177,
               "shufflenet": 0.0091, "mobilenet": 0.014}


@dataclass(frozen=True)
class NetworkCost:
    """``samples_per_node_iter``: samples one node processes per iteration (converts a measured rate into an
    iteration time; assumed, 256 = 4-6 GPUs x 32-64); ``gradient_gb`` by model name (lower-case prefix match,
    else ``default_gradient_gb``); ``alpha``, ``xi1``, ``xi2``, ``overhead_s`` as in eqs. 6-8 (seconds per
    iteration per group spanned); bandwidths come from the topology (GB/s)."""

    topology: Topology
    samples_per_node_iter: float = 256.0
    gradient_gb: Mapping[str, float] = field(default_factory=lambda: dict(GRADIENT_GB))
    default_gradient_gb: float = 0.1
    alpha: float = 1.0
    xi1: float = 1.0
    xi2: float = 1.0
    overhead_s: float = 1e-3
    params: CommParams = field(init=False, repr=False, compare=False)     # the contention model's, from the above

    def __post_init__(self) -> None:
        if self.samples_per_node_iter <= 0 or self.default_gradient_gb < 0:
            raise BadValue(f"NetworkCost: samples_per_node_iter must be > 0 and gradients >= 0, got "
                           f"{self.samples_per_node_iter}, {self.default_gradient_gb}")
        p = CommParams(alpha=self.alpha, xi1=self.xi1, xi2=self.xi2, b_intra=self.topology.intra_gbps,
                       b_inter=self.topology.inter_gbps, reduce_speed=1e3, overhead=self.overhead_s)
        object.__setattr__(self, "params", p)

    def grad(self, model: str) -> float:
        """The gradient size (GB) of ``model``."""
        m = model.lower()
        return next((v for k, v in self.gradient_gb.items() if m.startswith(k)), self.default_gradient_gb)

    def factors(self, jobs: Sequence[tuple[str, Sequence[str], float]]) -> np.ndarray:
        """Per job (model, nodes, measured rate at that size): the factor its rate is multiplied by where it
        runs, given every other job in ``jobs`` (they contend on shared groups). 1 inside one group."""
        if not jobs:
            return np.zeros(0)
        gid: dict[str, int] = {}
        rows = [[gid.setdefault(self.topology.group(n), len(gid)) for n in nodes] for _, nodes, _ in jobs]
        touch = np.zeros((len(jobs), max(len(gid), 1)), dtype=bool)
        for j, r in enumerate(rows):
            touch[j, r] = True
        spans = touch.sum(axis=1)
        p = contention(touch & (spans > 1)[:, None])
        n = np.array([len(nodes) for _, nodes, _ in jobs], dtype=float)
        rate = np.array([r for _, _, r in jobs], dtype=float)
        grad = np.array([self.grad(m) for m, _, _ in jobs])
        return self._factor(n, spans, p, grad, rate)

    def predicted(self, model: str, sizes: np.ndarray, spans: np.ndarray, p: np.ndarray,
                  rates: np.ndarray) -> np.ndarray:
        """The factor for hypothetical sizes / spans / contention counts (the planner's values)."""
        return self._factor(np.asarray(sizes, float), np.asarray(spans), np.asarray(p), self.grad(model),
                            np.asarray(rates, float))

    def _factor(self, n: np.ndarray, spans: np.ndarray, p: np.ndarray, grad: np.ndarray | float,
                rate: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t_meas = np.where(rate > 0, n * self.samples_per_node_iter / rate, 0.0)
        inside = iteration_time(n, 1, 0, grad, 0.0, self.params)
        here = iteration_time(n, spans, p, grad, 0.0, self.params)
        t_here = np.maximum(t_meas - inside, 0.0) + here
        return np.where((n > 1) & (spans > 1) & (t_here > 0), t_meas / np.where(t_here > 0, t_here, 1.0), 1.0)


def size_factors(net: NetworkCost, jobs: Sequence[JobState],
                 pool: Sequence[str]) -> Callable[[JobState, np.ndarray], np.ndarray]:
    """For the planner's values: ``f(job, sizes) -> factors`` predicting each size's network factor if the job
    keeps its groups and grows compactly (into its own groups' free nodes, then the groups with the most free
    nodes), contending with the spread jobs already on those groups. ``jobs`` are the planner's JobStates."""
    topo = net.topology
    held = {n for j in jobs for n in j.nodes}
    free_by: dict[str, int] = {}
    for n in pool:
        if n not in held:
            g = topo.group(n)
            free_by[g] = free_by.get(g, 0) + 1
    groups_of = {j.name: {topo.group(n) for n in j.nodes} for j in jobs}
    spread = {name: gs for name, gs in groups_of.items() if len(gs) > 1}

    def f(job: JobState, sizes: np.ndarray) -> np.ndarray:
        sizes = np.asarray(sizes)
        own: dict[str, int] = {}
        for n in job.nodes:
            g = topo.group(n)
            own[g] = own.get(g, 0) + 1
        own_cap = sorted(((c + free_by.get(g, 0), g) for g, c in own.items()), reverse=True)
        others = sorted(((c, g) for g, c in free_by.items() if g not in own), reverse=True)
        seq = own_cap + others
        caps = np.cumsum([c for c, _ in seq]) if seq else np.zeros(0)
        spans = np.searchsorted(caps, sizes, side="left") + 1
        spans = np.where(sizes <= job.size, np.maximum(1, np.minimum(spans, len(own) or 1)), spans)
        spans = np.minimum(spans, max(len(seq), 1))
        p = np.zeros(len(sizes), dtype=np.int64)
        for i, s in enumerate(spans):
            if s > 1:
                used = {g for _, g in seq[: int(s)]}
                p[i] = 1 + sum(1 for name, gs in spread.items() if name != job.name and gs & used)
        rates = np.array([job.curve.rate(int(k)) for k in sizes])
        return net.predicted(job.spec.model, sizes, spans, p, rates)

    return f
