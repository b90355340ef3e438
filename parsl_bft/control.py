"""The control loop shared by the simulator and the real runtime: admission, reclaims, re-planning, costs.

It holds who runs where and charges BFTrainer's costs (docs/explanation/architecture.md, "accounting"):
- a job that is rescaled by the plan pauses: t_up (grow) or t_down (shrink) seconds at its CURRENT rate;
- a job that loses nodes to the facility pays t_down at its current rate, once per reclaim event;
- a job left below min_nodes by a reclaim stops (size 0) and its remaining nodes go back to the pool.
Progress itself comes from outside: the simulator's rate model or real training fragments.
The planner is any object with ``plan(jobs, pool, now, remaining) -> Plan`` (no MILP import here).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import BadValue
from .jobs import JobSpec
from .planner.problem import JobPlanner, JobState, Plan
from .scaling import ScalingCurve

if TYPE_CHECKING:
    from .idle.predict import Predictor
    from .planner.freeze import LayerThroughput


@dataclass
class ActiveJob:
    """An admitted job's books: its planner state, when it was admitted, what rescales and reclaims cost it."""

    state: JobState
    admitted_at: float
    rescale_loss: float = 0.0       # samples
    reclaim_loss: float = 0.0       # samples
    rescales: int = 0
    reclaims: int = 0
    node_seconds: float = 0.0
    finished_at: float | None = None
    rate_scale: float = 1.0         # where it runs costs communication (the simulator's network model)

    @property
    def name(self) -> str:
        """The job's name."""
        return self.state.name

    @property
    def rate(self) -> float:
        """Samples/s where it runs now (its size, freeze level and placement)."""
        return self.state.rate() * self.rate_scale

    def charge(self, samples: float, reclaim: bool) -> None:
        """Losses come out of progress (never below zero: a job cannot lose more than it has done); how far the
        job had trained is kept (``JobState.trained``)."""
        lost = min(samples, self.state.samples_done)
        if lost > 0:
            self.state.trained = max(self.state.trained, self.state.samples_done)
        self.state.samples_done -= lost
        if reclaim:
            self.reclaim_loss += lost
            self.reclaims += 1
        else:
            self.rescale_loss += lost
            self.rescales += 1


@dataclass
class Timeline:
    """What the plots need: at each plan, the time, the idle nodes and the nodes each group (model or job) holds."""

    t: list[float] = field(default_factory=list)
    idle: list[int] = field(default_factory=list)
    held: list[dict[str, int]] = field(default_factory=list)

    def record(self, t: float, ctl: Controller, group: Callable[[ActiveJob], str]) -> None:
        """Append one point: the time, the idle pool's size and the nodes each ``group`` of jobs holds."""
        held: dict[str, int] = {}
        for a in ctl.active.values():
            if a.state.size:
                held[group(a)] = held.get(group(a), 0) + a.state.size
        self.t.append(t)
        self.idle.append(len(ctl.pool))
        self.held.append(held)


@dataclass
class Controller:
    """Who runs where: the waiting queue, the active jobs' books, the idle pool, and a re-plan that charges the
    rescale costs. The simulator and the orchestrator drive it with events; only it writes its job records."""

    jobs: list[JobSpec]
    curves: dict[str, ScalingCurve]
    planner: JobPlanner
    max_concurrent: int = 10
    model_costs: bool = True     # the simulator charges modelled losses; the runtime's losses are real
    pool: dict[str, float] = field(default_factory=dict)        # idle node -> expected end of idleness
    predictor: Predictor | None = None   # idle.predict: predicted remaining idle time (else the ``until`` given)
    layers: dict[str, LayerThroughput] = field(default_factory=dict)    # model -> its layer throughput
    held_before: dict[str, float] = field(default_factory=dict)   # node-seconds jobs held in earlier runs
    waiting: deque[JobSpec] = field(init=False)
    active: dict[str, ActiveJob] = field(default_factory=dict)
    done: list[ActiveJob] = field(default_factory=list)
    plans: int = 0
    solve_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise BadValue(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        self.waiting = deque(sorted(self.jobs, key=lambda j: (j.submit, j.name)))

    # --- events --------------------------------------------------------------------------------------
    def nodes_joined(self, nodes: Sequence[str], until: Iterable[float] = (), t: float | None = None) -> None:
        """``nodes`` became idle (at ``t``), each until its ``until`` if known (none given: no known end)."""
        ends = list(until) or [math.inf] * len(nodes)
        for n, u in zip(nodes, ends):
            self.pool[n] = u
        if self.predictor is not None:
            assert t is not None, "a predictor learns from when nodes come and go: pass t"
            self.predictor.joined(nodes, t, ends)

    def nodes_left(self, nodes: Iterable[str], t: float | None = None) -> list[str]:
        """The facility took ``nodes`` back. Returns the names of jobs that lost nodes (charged t_down)."""
        if self.predictor is not None:
            assert t is not None, "a predictor learns from when nodes come and go: pass t"
            self.predictor.left(nodes, t)
        gone = set(nodes)
        for n in gone:
            self.pool.pop(n, None)
        hit = []
        for a in self.active.values():
            s = a.state
            if gone.intersection(s.nodes):
                a.charge(s.spec.t_down * a.rate if self.model_costs else 0.0, reclaim=True)
                kept = tuple(n for n in s.nodes if n not in gone)
                s.nodes = kept if len(kept) >= s.spec.min_nodes else ()
                hit.append(a.name)
        return hit

    def bind(self, name: str, node: str, confirmed: Collection[str] = ()) -> None:
        """The executor put one of ``name``'s ranks on ``node`` (it cannot be told where): make the books say so.
        The job gives up a planned node no rank of it has ``confirmed``, to whoever held ``node`` (job or pool)."""
        s = self.active[name].state
        if node in s.nodes or node not in self.pool:
            return
        spare = next((n for n in s.nodes if n not in confirmed), None)
        if spare is None:
            return
        for a in self.active.values():
            if node in a.state.nodes:
                a.state.nodes = tuple(spare if n == node else n for n in a.state.nodes)
        s.nodes = tuple(node if n == spare else n for n in s.nodes)

    def submit(self, spec: JobSpec) -> bool:
        """A job that arrived while the loop runs joins the queue; False if it is queued or active already."""
        if spec.name in self.active or any(j.name == spec.name for j in self.waiting):
            return False
        self.waiting.append(spec)
        return True

    def accrue(self, dt: float) -> None:
        """``dt`` seconds passed: every active job held its nodes that long."""
        for a in self.active.values():
            a.node_seconds += a.state.size * dt

    def progressed(self, name: str, samples_done: float) -> None:
        """Real progress (the runtime's fragments): where an active job stands now."""
        if name in self.active:
            self.active[name].state.samples_done = samples_done

    def measured(self, name: str, curve: ScalingCurve) -> None:
        """A new measured throughput curve for a job: the planner uses it from the next plan on."""
        self.curves[name] = curve
        if name in self.active:
            self.active[name].state.curve = curve

    @property
    def demand(self) -> int:
        """Nodes every active and waiting job could use at most (no pilot is worth more than this)."""
        return sum(a.state.spec.max_nodes for a in self.active.values()) + sum(j.max_nodes for j in self.waiting)

    def job_finished(self, name: str, t: float) -> None:
        """``name`` finished at ``t``: it leaves the active jobs (its nodes go back to the plan) for ``done``."""
        a = self.active.pop(name)
        a.finished_at = t
        a.state.nodes = ()
        self.done.append(a)

    def admit(self, t: float) -> None:
        """Start the waiting jobs submitted by ``t``, in submit order, while fewer than max_concurrent run."""
        while self.waiting and len(self.active) < self.max_concurrent and self.waiting[0].submit <= t:
            spec = self.waiting.popleft()
            self.active[spec.name] = ActiveJob(JobState(spec, self.curves[spec.model],
                                                        layers=self.layers.get(spec.model)), admitted_at=t,
                                               node_seconds=self.held_before.get(spec.name, 0.0))

    def next_submit(self) -> float:
        """When the next waiting job could be admitted (inf: none waits, or no room for one)."""
        return self.waiting[0].submit if self.waiting and len(self.active) < self.max_concurrent else math.inf

    # --- planning ------------------------------------------------------------------------------------
    def replan(self, t: float) -> Plan | None:
        """Admit what is due, ask the planner for sizes and nodes, charge every rescale, apply the plan
        (None: no active job)."""
        self.admit(t)
        if not self.active:
            return None
        states = [a.state for a in self.active.values()]
        # expected idle time left per node; the planner uses it only if it is horizon-aware
        if self.predictor is not None:
            remaining = self.predictor.remaining(t, list(self.pool))
        else:
            remaining = {n: u - t for n, u in self.pool.items() if u < math.inf}
        plan = self.planner.plan(states, list(self.pool), now=t, remaining=remaining)
        self.plans += 1
        self.solve_times.append(plan.solve_s)
        for a in self.active.values():
            k = plan.sizes[a.name]
            level = plan.freeze.get(a.name, a.state.freeze)
            restart = k != a.state.size or (k and level != a.state.freeze)     # a new level restarts too
            if restart and a.state.size:     # starting from 0 nodes costs nothing (rate 0)
                s = a.state.spec
                lost = (s.t_up if k >= a.state.size else s.t_down) * a.rate
                a.charge(lost if self.model_costs else 0.0, reclaim=False)
            a.state.nodes = plan.allocation[a.name]
            a.state.freeze = level
        return plan

    @property
    def allocated(self) -> int:
        """Nodes the active jobs hold."""
        return sum(a.state.size for a in self.active.values())
