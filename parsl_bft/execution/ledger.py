"""A run as its event log tells it: where each job stands, its newest checkpoint, and per fragment the node-time
it held and the samples it kept. The live view, the final table and `parsl-bft status` all read this, so they
agree with each other and stay true whatever the load.

A job is ``running`` from a fragment's launch until that fragment ends (a fragment asked to stop is running
until it has saved), ``waiting`` between fragments, ``done`` or ``failed`` for good, and ``stopped`` when the
run ended (its time cap, a stop, a signal, an error) before the job did.

E_used (``JobLedger.e_used``): the samples a job kept, worked at its *reference rate*, per node-second it held.
The reference rate is the fastest per-node training rate the job's own fragments measured in this state
directory: samples per second of training per node, from a fragment's result (or, for a fragment that failed
after saving, the samples it kept per node-second it held). ``RefRate`` names the fragment and when it ended.
Every fragment kept at most that rate times the node-time it held, so E_used is at most 1 by construction: a
loaded machine shows as a lower E_used, never as one above 1.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .events import (
    Done,
    Event,
    Failed,
    FragmentDone,
    FragmentFailedEvent,
    Launch,
    RunEnd,
    Stage,
    Start,
    Stop,
    parse_event,
)
from .jobstore import JobStatus

StoredEvent = tuple[float, str, dict[str, Any]]      # (unix time, kind, detail): JobStore.events()'s rows


def stop_words(why: str) -> str:
    """A Stop event's ``why`` for people: 'timeout' is the run's time cap (an error's is its own words)."""
    return RunEnd.words(why)


@dataclass(frozen=True)
class RefRate:
    """A job's reference rate: samples per second per node, measured by ``fragment`` on ``nodes`` nodes, which
    ended at unix time ``at``."""

    per_node_s: float
    fragment: str
    nodes: int
    at: float


def ref_words(ref: dict[str, Any] | None) -> str:
    """A reference rate (``asdict(RefRate)``, as the run's summary holds it) for people."""
    if not ref:
        return "none measured yet"
    at = time.strftime("%H:%M:%S", time.localtime(ref["at"]))
    return f"{ref['per_node_s']:,.0f} samples/s per node ({ref['nodes']} node(s), fragment ended {at})"


@dataclass
class JobLedger:
    """One job by the event log."""

    name: str
    phase: JobStatus = JobStatus.WAITING
    nodes: int = 0                   # the running fragment's
    freeze: int = 0                  # ... and the layers it trains frozen
    fragments: int = 0               # ended
    saved_step: int = 0              # the newest committed step
    checkpoint: str | None = None    # the final one (done) or the newest staged one, as the log names it
    kept: float = 0.0                # samples kept (committed) by its fragments
    held_node_s: float = 0.0         # node-seconds its fragments held, launch to end
    ref: RefRate | None = None
    why: str = ""                    # stopped: why the run ended; failed: the error
    _launched: dict[str, tuple[float, int]] = field(default_factory=dict)   # fragment -> (unix time, nodes)

    def _segment(self, kept: float, held_node_s: float, rate: float | None, fragment: str, nodes: int,
                 at: float) -> None:
        self.fragments += 1
        self.kept += max(kept, 0.0)
        self.held_node_s += held_node_s
        if rate is not None and rate > 0 and (self.ref is None or rate > self.ref.per_node_s):
            self.ref = RefRate(rate, fragment, nodes, at)

    def e_used(self, samples_done: float, node_s: float) -> float | None:
        """Samples kept (at most ``samples_done``, the job's committed total) at the reference rate per
        node-second held (at least ``node_s``, the orchestrator's own count); None before it held any."""
        held = max(node_s, self.held_node_s)
        if held <= 0:
            return None
        work = min(samples_done, self.kept)
        return work / self.ref.per_node_s / held if work > 0 and self.ref is not None else 0.0

    @property
    def state(self) -> str:
        """Where it stands, for people: 'running on 2 node(s)', 'stopped: time cap reached', 'done', ..."""
        if self.phase is JobStatus.RUNNING:
            return f"running on {self.nodes} node(s)" + (f", {self.freeze} layer(s) frozen" if self.freeze else "")
        if self.phase is JobStatus.STOPPED:
            return f"stopped: {stop_words(self.why)}"
        return self.phase.value


@dataclass
class RunLedger:
    """Every job of a state directory by its event log; ``feed`` it events as they come (oldest first).
    ``batch``: each job's global batch (steps -> samples, for logs that do not say the samples)."""

    batch: dict[str, int]
    jobs: dict[str, JobLedger] = field(default_factory=dict)
    ended: str | None = None          # why the newest orchestrator life ended; None while it runs
    started: float | None = None      # unix time the newest life started

    def job(self, name: str) -> JobLedger:
        """The job's ledger (a fresh one for a job the log has not named yet)."""
        return self.jobs.setdefault(name, JobLedger(name))

    def feed(self, events: Iterable[StoredEvent]) -> RunLedger:
        """Take ``events`` (as stored: read with ``parse_event``; a kind this code does not know is left out)
        into account; returns itself. A damaged event is a ValueError."""
        for t, kind, d in events:
            ev = parse_event(kind, d)
            if ev is not None:
                self._one(t, ev)
        return self

    def _one(self, t: float, ev: Event) -> None:
        if isinstance(ev, Start):
            self.ended, self.started = None, t
            for name in ev.jobs:
                j = self.job(name)
                j.phase, j.nodes, j.why = JobStatus.WAITING, 0, ""
                j._launched.clear()          # a dead life's fragments were fenced off
                j.saved_step = max(j.saved_step, int(ev.resume.get(name, 0)))
        elif isinstance(ev, Stop):
            self.stopped(str(ev.why))
        elif isinstance(ev, Launch | FragmentDone | FragmentFailedEvent | Done | Failed | Stage):
            self._job_event(self.job(ev.job), t, ev)

    def stopped(self, why: str) -> None:
        """The run ended (``why``: a Stop event's, or "gone": its orchestrator died without one): jobs not done
        or failed stopped with it."""
        self.ended = why
        for j in self.jobs.values():
            if j.phase in (JobStatus.WAITING, JobStatus.RUNNING):      # one stopped before keeps its why
                j.phase, j.nodes, j.why = JobStatus.STOPPED, 0, why

    def _job_event(self, j: JobLedger, t: float,
                   ev: Launch | FragmentDone | FragmentFailedEvent | Done | Failed | Stage) -> None:
        batch = self.batch.get(j.name, 0)
        if isinstance(ev, Launch):
            j.phase, j.nodes, j.freeze = JobStatus.RUNNING, int(ev.size), int(ev.freeze or 0)
            j._launched[ev.fragment] = (t, int(ev.size))
        elif isinstance(ev, FragmentDone):
            ended, nodes = float(t if ev.ended is None else ev.ended), int(ev.size)
            train_node_s = float(ev.train_s) * nodes
            kept = float((ev.end_step - ev.start_step) * batch if ev.samples is None else ev.samples)
            held = max((ended - float(ev.launched)) * nodes, train_node_s)
            j._segment(kept, held, kept / train_node_s if train_node_s > 0 else None, ev.fragment, nodes, ended)
            j.saved_step = max(j.saved_step, int(ev.end_step))
            self._between(j, ev.fragment)
        elif isinstance(ev, FragmentFailedEvent):
            launched, nodes = j._launched.get(ev.fragment, (t, 0))
            ended = float(t if ev.ended is None else ev.ended)
            held = max(ended - float(launched if ev.launched is None else ev.launched), 0.0) * nodes
            kept = max(int(ev.saved_step) - int(ev.resume_step), 0) * batch
            j._segment(kept, held, kept / held if held > 0 else None, ev.fragment, nodes, ended)
            j.saved_step = max(j.saved_step, int(ev.saved_step))
            self._between(j, ev.fragment)
        elif isinstance(ev, Done):
            j.phase, j.nodes, j.checkpoint = JobStatus.DONE, 0, ev.checkpoint
        elif isinstance(ev, Failed):
            j.phase, j.nodes, j.why = JobStatus.FAILED, 0, str(ev.error)
        elif ev.checkpoint:
            j.checkpoint = ev.checkpoint

    @staticmethod
    def _between(j: JobLedger, fragment: str) -> None:
        j._launched.pop(fragment, None)
        if j.phase is JobStatus.RUNNING and not j._launched:
            j.phase, j.nodes = JobStatus.WAITING, 0
