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
from enum import StrEnum
from typing import Any

from .events import EventKind

StoredEvent = tuple[float, str, dict[str, Any]]      # (unix time, kind, detail): JobStore.events()'s rows


class Phase(StrEnum):
    """Where a job stands, by the event log."""

    WAITING = "waiting"        # no fragment running now (between fragments, or planned no nodes)
    RUNNING = "running"        # a fragment was launched and has not ended
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"        # the run ended before the job did; its newest checkpoint stays


STOP_WORDS = {"timeout": "time cap reached", "stopped": "run stopped", "interrupted": "interrupted (Ctrl-C)",
              "SIGTERM": "terminated (SIGTERM)", "gone": "orchestrator gone (it ended without saying why)"}


def stop_words(why: str) -> str:
    """A Stop event's ``why`` for people: 'timeout' is the run's time cap."""
    return STOP_WORDS.get(why, why)


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
    phase: Phase = Phase.WAITING
    nodes: int = 0                   # the running fragment's
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
        if self.phase is Phase.RUNNING:
            return f"running on {self.nodes} node(s)"
        if self.phase is Phase.STOPPED:
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
        """Take ``events`` into account; returns itself."""
        for t, kind, d in events:
            self._one(t, kind, d)
        return self

    def _one(self, t: float, kind: str, d: dict[str, Any]) -> None:
        if kind == EventKind.START:
            self.ended, self.started = None, t
            for name in d.get("jobs", []):
                j = self.job(name)
                j.phase, j.nodes, j.why = Phase.WAITING, 0, ""
                j._launched.clear()          # a dead life's fragments were fenced off
                j.saved_step = max(j.saved_step, int(d.get("resume", {}).get(name, 0)))
        elif kind == EventKind.STOP:
            self.stopped(str(d.get("why", "")))
        elif "job" in d:
            self._job_event(self.job(d["job"]), t, kind, d)

    def stopped(self, why: str) -> None:
        """The run ended (``why``: a Stop event's, or "gone": its orchestrator died without one): jobs not done
        or failed stopped with it."""
        self.ended = why
        for j in self.jobs.values():
            if j.phase in (Phase.WAITING, Phase.RUNNING):
                j.phase, j.nodes, j.why = Phase.STOPPED, 0, why

    def _job_event(self, j: JobLedger, t: float, kind: str, d: dict[str, Any]) -> None:
        batch = self.batch.get(j.name, 0)
        if kind == EventKind.LAUNCH:
            j.phase, j.nodes = Phase.RUNNING, int(d["size"])
            j._launched[d["fragment"]] = (t, int(d["size"]))
        elif kind == EventKind.FRAGMENT_DONE:
            ended, nodes = float(d.get("ended", t)), int(d["size"])
            train_node_s = float(d["train_s"]) * nodes
            kept = float(d.get("samples", (d["end_step"] - d["start_step"]) * batch))
            held = max((ended - float(d["launched"])) * nodes, train_node_s)
            j._segment(kept, held, kept / train_node_s if train_node_s > 0 else None, d["fragment"], nodes, ended)
            j.saved_step = max(j.saved_step, int(d["end_step"]))
            self._between(j, d["fragment"])
        elif kind == EventKind.FRAGMENT_FAILED:
            launched, nodes = j._launched.get(d["fragment"], (t, 0))
            ended = float(d.get("ended", t))
            held = max(ended - float(d.get("launched", launched)), 0.0) * nodes
            kept = max(int(d["saved_step"]) - int(d["resume_step"]), 0) * batch
            j._segment(kept, held, kept / held if held > 0 else None, d["fragment"], nodes, ended)
            j.saved_step = max(j.saved_step, int(d["saved_step"]))
            self._between(j, d["fragment"])
        elif kind == EventKind.DONE:
            j.phase, j.nodes, j.checkpoint = Phase.DONE, 0, d.get("checkpoint")
        elif kind == EventKind.FAILED:
            j.phase, j.nodes, j.why = Phase.FAILED, 0, str(d.get("error", ""))
        elif kind == EventKind.STAGE and d.get("checkpoint"):
            j.checkpoint = d["checkpoint"]

    @staticmethod
    def _between(j: JobLedger, fragment: str) -> None:
        j._launched.pop(fragment, None)
        if j.phase is Phase.RUNNING and not j._launched:
            j.phase, j.nodes = Phase.WAITING, 0
