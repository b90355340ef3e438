"""Trace-driven replay: the control loop of the real runtime, with a clock and a rate model for training."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from ..control import ActiveJob, Controller, Timeline
from ..errors import BadValue, ParslBftError
from ..idle.intervals import IdleEvent, IdleIntervals
from ..idle.predict import Predictor, make_predictor
from ..jobs import JobSet
from ..planner.freeze import LayerThroughput, charge_budget
from ..planner.problem import JobPlanner
from .costs import BFTRAINER, CostModel, SaveBooks, reclaim_cause
from .freezing import FreezeProfile, synthetic_profile

if TYPE_CHECKING:
    from ..idle.schedule import Schedule
    from ..planner.netcost import NetworkCost


@dataclass
class SimResult:
    """A replay's outcome: the span replayed, the node-seconds idle and allocated, every job's books, the
    planner's solve times, the timeline for plots and the configuration it ran with."""

    start: float
    end: float
    idle_node_s: float
    allocated_node_s: float
    events: int
    plans: int
    solve_times: list[float]
    jobs: list[ActiveJob]
    timeline: Timeline
    config: dict[str, Any]
    comm_node_s: float = 0.0        # allocated node-seconds weighted by the network's rate factor
    ceiling: dict[str, Any] | None = None    # metrics of the same replay with free rescales and reclaims (the limit)
    frozen_node_s: float = 0.0      # allocated node-seconds of jobs running with layers frozen
    cost_model: str = BFTRAINER     # what resizes and reclaims cost: BFTrainer's model or a costs file's name
    save_loss: float = 0.0          # samples not trained while periodic saves paused jobs (measured models)

    def metrics(self) -> dict[str, Any]:
        """The headline numbers: e_idle, e_used, utilisation, losses, plans and solve times, JCT and makespan."""
        work = sum(a.state.samples_done / a.state.curve.rate(1) for a in self.jobs)
        st = np.array(self.solve_times) if self.solve_times else np.zeros(1)
        return {
            "e_idle": work / self.idle_node_s if self.idle_node_s else 0.0,
            "e_used": work / self.allocated_node_s if self.allocated_node_s else 0.0,
            "util": self.allocated_node_s / self.idle_node_s if self.idle_node_s else 0.0,
            "samples": sum(a.state.samples_done for a in self.jobs),
            "rescale_loss": sum(a.rescale_loss for a in self.jobs),
            "reclaim_loss": sum(a.reclaim_loss for a in self.jobs),
            "save_loss": self.save_loss,
            "cost_model": self.cost_model,
            "jobs_finished": sum(a.finished_at is not None for a in self.jobs),
            "events": self.events,
            "plans": self.plans,
            "solve_p50_s": float(np.percentile(st, 50)),
            "solve_p99_s": float(np.percentile(st, 99)),
            "idle_node_s": self.idle_node_s,
            "allocated_node_s": self.allocated_node_s,
            "span_s": self.end - self.start,
            "net_factor": self.comm_node_s / self.allocated_node_s if self.allocated_node_s else 1.0,
            **({"ceiling_e_idle": self.ceiling["e_idle"], "ceiling_e_used": self.ceiling["e_used"]}
               if self.ceiling else {}),
            **self.jct_metrics(),
        }

    def jct_metrics(self) -> dict[str, Any]:
        """Average job completion time (arrival to end; jobs still running at the end count until then),
        makespan, jobs over their accuracy budget, and the share of node-seconds trained with layers frozen."""
        jct = [(a.finished_at if a.finished_at is not None else self.end) - a.state.spec.submit for a in self.jobs]
        ends = [a.finished_at for a in self.jobs if a.finished_at is not None]
        first = min((a.state.spec.submit for a in self.jobs), default=self.start)
        return {"avg_jct_s": float(np.mean(jct)) if jct else 0.0,
                "makespan_s": max(ends) - first if ends else 0.0,
                "budget_violations": int(sum(a.state.accuracy_spent > a.state.spec.accuracy_budget + 1e-9
                                             for a in self.jobs)),
                "frozen_share": self.frozen_node_s / self.allocated_node_s if self.allocated_node_s else 0.0}

    def job_rows(self) -> list[dict[str, Any]]:
        """One row per job: its progress, costs and freeze level at the end."""
        return [{"name": a.name, "model": a.state.spec.model, "samples_done": a.state.samples_done,
                 "samples": a.state.spec.samples, "finished_at": a.finished_at, "admitted_at": a.admitted_at,
                 "node_s": a.node_seconds, "rescales": a.rescales, "reclaims": a.reclaims,
                 "rescale_loss": a.rescale_loss, "reclaim_loss": a.reclaim_loss, "submit": a.state.spec.submit,
                 "freeze_level": a.state.freeze, "accuracy_spent": a.state.accuracy_spent} for a in self.jobs]

    def per_model(self) -> list[dict[str, Any]]:
        """Per model: jobs, finished, samples, node-seconds and the e_used they reached."""
        rows: dict[str, dict[str, Any]] = {}
        for a in self.jobs:
            r = rows.setdefault(a.state.spec.model, {"model": a.state.spec.model, "jobs": 0, "finished": 0,
                                                     "samples": 0.0, "node_s": 0.0, "work_1node_s": 0.0})
            r["jobs"] += 1
            r["finished"] += a.finished_at is not None
            r["samples"] += a.state.samples_done
            r["node_s"] += a.node_seconds
            r["work_1node_s"] += a.state.samples_done / a.state.curve.rate(1)
        for r in rows.values():
            r["e_used"] = r["work_1node_s"] / r["node_s"] if r["node_s"] else 0.0
        return sorted(rows.values(), key=lambda r: r["model"])

    def as_dict(self) -> dict[str, Any]:
        """Everything for the JSON report: the metrics, the configuration, per model and per job."""
        return {**self.metrics(), "config": self.config, "per_model": self.per_model(), "jobs": self.job_rows()}


SUBMITS = ("absolute", "relative")


class NoJobAdmitted(ParslBftError):
    """No job of the job set arrives before the replayed window ends: the replay would train nothing."""


def placed_in_window(jobset: JobSet, intervals: IdleIntervals, duration: float | None = None,
                     submits: str = "absolute") -> JobSet:
    """The job set with the submit times the replay uses. ``absolute``: as written (unix times of the log's own
    era); ``relative``: counted from the replayed window's first event - the earliest job arrives then and the
    gaps between jobs are kept - for a job set written for another log. Raises NoJobAdmitted, naming both
    spans and the option, when no job arrives before the window ends (rather than a replay of e_idle 0)."""
    if submits not in SUBMITS:
        raise BadValue(f"submits must be one of {', '.join(SUBMITS)}, got {submits!r}")
    if not jobset.jobs or not len(intervals.start):
        return jobset
    start = float(intervals.start.min())
    end = intervals.t1 if duration is None else min(intervals.t1, start + duration)
    first = min(j.submit for j in jobset.jobs)
    if submits == "relative":
        jobset = dataclasses.replace(jobset, jobs=[dataclasses.replace(j, submit=start + j.submit - first)
                                                   for j in jobset.jobs])
    elif first >= end:
        raise NoJobAdmitted(f"no job can be admitted: the job set's first submit time ({_utc(first)}) is at or "
                            f"after the end of the replayed window ({_utc(start)} to {_utc(end)}); count submit "
                            "times from the window's start with --submits relative (simulate(submits='relative'))")
    return jobset


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def simulate(intervals: IdleIntervals, jobset: JobSet, planner: JobPlanner, *, max_concurrent: int = 10,
             duration: float | None = None, progress: Callable[[float], object] | None = None,
             submits: str = "absolute", config: dict[str, Any] | None = None, network: NetworkCost | None = None,
             predict: str | Predictor = "history", schedule: Schedule | None = None, ceiling: bool = False,
             freeze: bool = True, freeze_profiles: dict[str, FreezeProfile] | None = None,
             until_done: bool = False, costs: CostModel | None = None) -> SimResult:
    """Replay ``intervals`` from their first event, for ``duration`` seconds or to their end.

    Jobs are admitted first-come-first-served by submit time (at most ``max_concurrent`` at once); the planner
    runs at every event (nodes join or leave, a job arrives or finishes); progress between events is
    P_j(n_j) * dt; costs are charged by the shared Controller. ``progress(fraction)`` is called as time advances.
    With ``network`` (a ``NetworkCost``), each job's rate is multiplied by the factor its placement and the
    other jobs' give it (eqs. 6-8 of SJF-BCO at group level), so placement shows in e_idle / e_used.
    ``predict``: what the planner (horizon-aware values, placement) is told of when idle nodes leave, a name
    from ``idle.predict.PREDICTORS`` or a predictor: ``history`` (online, past hole lengths only; default),
    ``easy`` (EASY reservations from requested walltimes; needs ``schedule``, an EASY replay), ``none``, or
    ``clairvoyant`` (the trace's real ends: an upper bound, not a realistic result).
    ``ceiling``: also replay with every rescale and reclaim free (same jobs, same admission rule, same planner)
    and report its e_idle / e_used as ``ceiling_e_idle`` / ``ceiling_e_used`` - no planner can beat them.
    ``submits``: ``absolute`` or ``relative`` job submit times (``placed_in_window``).
    Layer elasticity: jobs with ``freeze="auto"`` whose model has a layer profile (``jobset.layers``) may be
    frozen by the planner (``freeze=False`` turns it off for every job); their statistics come from
    ``freeze_profiles`` (job name -> ``sim.freezing.FreezeProfile``; default: ``synthetic_profile``), the
    penalty of the level they run at is charged to their accuracy budget as they train.
    ``until_done``: stop when every job has finished (a dedicated cluster), not at the end of the intervals.
    ``costs``: None for BFTrainer's cost model (the jobs' t_up / t_down), or a measured ``sim.costs.CostModel``.
    """
    jobset = placed_in_window(jobset, intervals, duration, submits)
    jobset = costs.applied(jobset) if costs is not None else jobset
    # the ceiling: the same jobs, freeze levels (layers) included, with free rescales and reclaims
    bound = simulate(intervals, dataclasses.replace(jobset, jobs=[dataclasses.replace(j, t_up=0.0, t_down=0.0)
                                                                  for j in jobset.jobs]),
                     planner, max_concurrent=max_concurrent, duration=duration, network=network, predict=predict,
                     schedule=schedule, freeze=freeze, freeze_profiles=freeze_profiles,
                     until_done=until_done).metrics() if ceiling else None
    events = intervals.events()
    if (first := next(events, None)) is None:
        raise BadValue("no idle capacity in the selected trace (no events)")
    start = first.time
    end = intervals.t1 if duration is None else min(intervals.t1, start + duration)
    predictor = make_predictor(predict, schedule) if isinstance(predict, str) else predict
    layers = {m: LayerThroughput(jobset.curves[m], p) for m, p in jobset.layers.items()} if freeze else {}
    # with freezing off too: the planner looks again whenever a freezable job reports, so both runs replan alike
    # the gradient statistics have the model's own number of layers (the penalty needs them to match)
    profiles = {j.name: (freeze_profiles or {}).get(j.name) or synthetic_profile(j, jobset.layers[j.model].n_layers)
                for j in jobset.jobs if j.freeze != "off" and j.model in jobset.layers}
    ctl = Controller(jobset.jobs, jobset.curves, planner, max_concurrent=max_concurrent, predictor=predictor,
                     layers=layers)
    books = SaveBooks(costs, reclaim_cause(predict)) if costs is not None else None
    r = _Replay(ctl, events, first, profiles, network, books)
    while r.t < end:
        if r.step(end, until_done):
            break
        if progress is not None:
            progress((r.t - start) / (end - start) if end > start else 1.0)
    jobs = ctl.done + list(ctl.active.values())
    return SimResult(start, r.t if until_done else end, r.idle_s, r.alloc_s, r.n_events, ctl.plans,
                     ctl.solve_times, jobs, r.tl, config or {}, r.comm_s if network is not None else r.alloc_s,
                     bound, r.frozen_s, costs.name if costs is not None else BFTRAINER,
                     books.stall_loss if books is not None else 0.0)


class _Replay:
    """The replay between events: the clock, the Controller, the next idle event and the node-seconds counted."""

    def __init__(self, ctl: Controller, events: Iterator[IdleEvent], first: IdleEvent,
                 profiles: dict[str, FreezeProfile], network: NetworkCost | None, books: SaveBooks | None) -> None:
        self.ctl, self.events, self.profiles, self.network, self.books = ctl, events, profiles, network, books
        self.pending: IdleEvent | None = first
        self.t = first.time
        self.tl = Timeline()
        self.idle_s = self.alloc_s = self.comm_s = self.frozen_s = 0.0
        self.n_events = 0

    def finish_time(self, a: ActiveJob) -> float:
        """When ``a`` finishes at its current rate."""
        r = a.rate
        return self.t + a.state.remaining / r if r > 0 else math.inf

    def next_report(self, a: ActiveJob) -> float:
        """When a freezable job's fragments next report statistics (every ``interval`` of its progress): the
        planner looks again then, as the runtime does when a fragment ends."""
        prof, r, t = self.profiles.get(a.name), a.rate, self.t
        if prof is None or r <= 0:
            return math.inf
        x = a.state.samples_done / a.state.spec.samples
        k = math.floor(x / prof.interval + 1e-9) + 1
        # a job a rounding error short of a report time would get a report "now" forever: at Unix-epoch times
        # (an idle trace) t + 1e-12 == t, so time would stop; that report is the one just made
        while (at := t + (k * prof.interval - x) * a.state.spec.samples / r) <= t:
            k += 1
        return at

    def step(self, end: float, until_done: bool) -> bool:
        """Apply everything that happens at the current time, re-plan, and advance to the next instant something
        happens (at most ``end``). True when the replay is over before ``end``."""
        ctl, t = self.ctl, self.t
        if self.pending is not None and self.pending.time <= t:
            self.reclaim(self.pending.left, t)
            ctl.nodes_joined(self.pending.joined, self.pending.joined_until, t)
            self.n_events += 1
            self.pending = next(self.events, None)
        # done: within rounding of its work, or so close that its end is not a later time (Unix-epoch times
        # of an idle trace resolve ~0.2 us: the last crumb of work would otherwise take a zero-length step forever)
        for a in [a for a in ctl.active.values()
                  if a.state.remaining <= 1e-9 * a.state.spec.samples or self.finish_time(a) <= t]:
            ctl.job_finished(a.name, t)
        if until_done and not ctl.active and not ctl.waiting:
            return True
        for a in ctl.active.values():          # what the job's fragments would have reported by now
            if a.name in self.profiles:        # (a charged pause costs time, it does not untrain the model)
                a.state.trained = max(a.state.trained, a.state.samples_done)
                a.state.grad_stats = self.profiles[a.name].stats(a.state.trained / a.state.spec.samples)
        ctl.replan(t)
        if self.network is not None:
            running = [a for a in ctl.active.values() if a.state.size]
            f = self.network.factors([(a.state.spec.model, a.state.nodes, a.state.curve.rate(a.state.size))
                                      for a in running])
            for a, x in zip(running, f):
                a.rate_scale = float(x)
        self.tl.record(t, ctl, lambda a: a.state.spec.model)
        nxt = min(self.pending.time if self.pending is not None else math.inf, ctl.next_submit(),
                  min((self.finish_time(a) for a in ctl.active.values()), default=math.inf),
                  min((self.next_report(a) for a in ctl.active.values()), default=math.inf), end)
        nxt = max(nxt, t)
        self.advance(nxt - t)
        if nxt == t and self.pending is None and not any(a.state.remaining <= 0 for a in ctl.active.values()):
            return True
        self.t = nxt
        return False

    def reclaim(self, nodes: tuple[str, ...], t: float) -> None:
        """The facility takes ``nodes``: the Controller charges each job hit a restart (``t_down``); under a
        measured model a reclaim without notice also loses the work since the last periodic save."""
        if self.books is None:                   # BFTrainer's model: the Controller's t_down is all
            self.ctl.nodes_left(nodes, t)
            return
        before = {a.name: (a.state.size, a.rate) for a in self.ctl.active.values()}
        for name in self.ctl.nodes_left(nodes, t):
            if name in self.ctl.active:
                a = self.ctl.active[name]
                lost = min(self.books.reclaimed(a.state.spec.model, *before[name]), a.state.samples_done)
                a.state.samples_done -= lost
                a.reclaim_loss += lost

    def advance(self, dt: float) -> None:
        """``dt`` seconds of training at the planned sizes, and of node-seconds counted."""
        ctl = self.ctl
        for a in ctl.active.values():
            if a.state.size:
                step = min(a.state.spec.samples - a.state.samples_done, a.rate * dt)
                if self.books is not None:     # the periodic saves' stalls
                    step = self.books.trained(a.state.spec.model, a.state.size, dt, step)
                if a.state.freeze:             # new progress at this level spends budget; retraining what a
                    charge_budget(a.state, (a.state.samples_done + step - a.state.trained)      # charged pause
                                  / a.state.spec.samples)                                         # lost does not
                    self.frozen_s += a.state.size * dt
                a.state.samples_done += step
                a.node_seconds += a.state.size * dt
                self.comm_s += a.state.size * dt * a.rate_scale
        self.idle_s += len(ctl.pool) * dt
        self.alloc_s += ctl.allocated * dt
