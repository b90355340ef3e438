"""What the planner is asked and what it answers. No Parsl here: the simulator and the runtime share this."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..jobs import JobSpec
from ..nodes import site_of
from ..scaling import ScalingCurve

if TYPE_CHECKING:
    from .freeze import LayerThroughput

__all__ = ["JobPlanner", "JobState", "Plan", "SizeProblem", "site_of"]


@dataclass
class JobState:
    """A job as the planner sees it at one instant."""

    spec: JobSpec
    curve: ScalingCurve
    nodes: tuple[str, ...] = ()          # nodes it holds now (reclaimed ones already removed)
    samples_done: float = 0.0
    trained: float = 0.0                 # the furthest samples_done has reached (a pause the simulator charges as
                                         # lost samples costs time: it does not untrain the model)
    freeze: int = 0                      # layers frozen now (layer elasticity, planner/freeze.py)
    accuracy_spent: float = 0.0          # of spec.accuracy_budget, by the penalty of the levels it trained at
    grad_stats: dict[str, Any] | None = None   # the last per-layer gradient statistics its fragments reported
    layers: LayerThroughput | None = None      # when its model was measured with layers frozen

    def rate(self, n: int | None = None) -> float:
        """Samples/s on n nodes (default: its own) at its freeze level."""
        n = self.size if n is None else n
        return self.layers.rate(n, self.freeze) if self.layers is not None and self.freeze else self.curve.rate(n)

    @property
    def name(self) -> str:
        """The job's name (its spec's)."""
        return self.spec.name

    @property
    def size(self) -> int:
        """Nodes it holds now."""
        return len(self.nodes)

    @property
    def remaining(self) -> float:
        """Samples still to train."""
        return max(self.spec.samples - self.samples_done, 0.0)

    @property
    def untrained_share(self) -> float:
        """The share of the job's samples its model has never trained on: what a frozen level is still charged
        for (a pause charged as lost samples leaves it as it was)."""
        return max(self.spec.samples - max(self.trained, self.samples_done), 0.0) / self.spec.samples


@dataclass
class Plan:
    """The planner's answer: nodes per job, predicted rates, the rescale pauses it will cost, how it was solved."""

    allocation: dict[str, tuple[str, ...]]
    sizes: dict[str, int]
    rates: dict[str, float]              # predicted samples/s at the new size
    rescale_cost: dict[str, float]       # samples lost to pausing (t_up / t_down at the current rate)
    objective: float
    method: str
    status: str                          # optimal | feasible (time limit) | fallback-dp | heuristic
    solve_s: float
    notes: list[str] = field(default_factory=list)
    freeze: dict[str, int] = field(default_factory=dict)   # layers each job should have frozen (layer elasticity)

    def changed(self, jobs: list[JobState]) -> list[str]:
        """The jobs whose size this plan changes (each pays a rescale)."""
        return [j.name for j in jobs if self.sizes.get(j.name, 0) != j.size]


TIE_EPS = 1e-6


@dataclass
class SizeProblem:
    """The exact size-choice problem: one size per job, sum of sizes <= capacity.

    ``allowed[j]`` lists job j's feasible sizes (0 first), ``value[j][i]`` the objective of choosing
    ``allowed[j][i]`` (gain over the horizon minus the rescale cost), a multiple-choice knapsack.
    """

    names: list[str]
    allowed: list[np.ndarray]
    value: list[np.ndarray]
    capacity: int

    def objective(self, sizes: dict[str, int]) -> float:
        """The value of one size per job (-inf if a size is not allowed): what the solvers maximise."""
        total = 0.0
        for n, a, v in zip(self.names, self.allowed, self.value):
            idx = np.flatnonzero(a == sizes.get(n, 0))
            if not len(idx):
                return -math.inf
            total += float(v[idx[0]])
        return total

    def tie_broken(self, eps: float = TIE_EPS) -> SizeProblem:
        """The same problem with exact ties broken one way for every exact solver: a node is worth
        eps * (J - j) more to the j-th job (list order: admission order), so earlier jobs win ties. Speedup
        objectives tie often (every model's U(1) is 1: which job gets a lone node is a tie), and a MILP and a DP
        that break ties differently follow different trajectories over a replay. Steps of eps (1e-6) are what
        HiGHS resolves with gapAbs 1e-8; the plan is optimal for the real values to within eps * J * N (2.6e-3
        at 10 jobs x 256 nodes); the objective reported is the unperturbed one."""
        J = len(self.names)
        value = [v + eps * a * (J - j) for j, (a, v) in enumerate(zip(self.allowed, self.value))]
        return SizeProblem(self.names, self.allowed, value, self.capacity)

    def feasible(self, sizes: dict[str, int]) -> bool:
        """Whether ``sizes`` fits the capacity with an allowed size for every job."""
        return (sum(sizes.values()) <= self.capacity
                and all(sizes.get(n, 0) in set(a.tolist()) for n, a in zip(self.names, self.allowed)))


class JobPlanner(Protocol):
    """What the Controller asks of a planner (``Planner``, ``MultiSitePlanner``): a plan for the active jobs
    over the idle pool at ``now``, given each node's expected idle time left where known."""

    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0,
             remaining: dict[str, float] | None = None) -> Plan:
        """One plan: a size and nodes per job."""
        ...
