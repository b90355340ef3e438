"""Predicted ends of idle stretches ("holes"): what a planner can know about when each idle node leaves.

A live Slurm or PBS knows the start times it plans for waiting jobs; an idle-interval log holds no such
predictions. Predictors here see only the past (plus, for ``EasyReservations``, the scheduler's own plan made
from requested walltimes), and answer ``remaining(t, since)``: the expected idle time left per node, given when
each node became idle. ``Clairvoyant`` (the real ends) is an upper bound to report, never a result.

Interface (duck-typed, used by ``control.Controller``):
  joined(nodes, t, until)   nodes became idle at t (``until``: the trace's real ends, used only by Clairvoyant)
  left(nodes, t)            nodes were taken back at t (their hole lengths are now known)
  remaining(t, nodes)       {node: predicted seconds left} for the idle ``nodes`` (omitted = unknown)
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import BadValue

PREDICTORS = ("history", "easy", "clairvoyant", "none")


class Predictor(Protocol):
    """The interface ``control.Controller`` uses (the module docstring says what each call means)."""

    def joined(self, nodes: Sequence[str], t: float, until: Iterable[float] = ()) -> None:
        """``nodes`` became idle at ``t``."""
        ...

    def left(self, nodes: Iterable[str], t: float) -> None:
        """``nodes`` were taken back at ``t``."""
        ...

    def remaining(self, t: float, nodes: Iterable[str]) -> dict[str, float]:
        """Predicted idle seconds left per node (a node left out: unknown)."""
        ...


class NoPrediction:
    """Horizon-blind: nothing is known."""

    name = "none"

    def joined(self, nodes: Sequence[str], t: float, until: Iterable[float] = ()) -> None:
        """Nothing to learn from a join."""

    def left(self, nodes: Iterable[str], t: float) -> None:
        """Nothing to learn from a reclaim."""

    def remaining(self, t: float, nodes: Iterable[str]) -> dict[str, float]:
        """Nothing is known: no node has a prediction."""
        return {}


class Clairvoyant(NoPrediction):
    """The real end of every hole (from the trace). An upper bound: no scheduler knows this."""

    name = "clairvoyant"

    def __init__(self) -> None:
        self.until: dict[str, float] = {}

    def joined(self, nodes: Sequence[str], t: float, until: Iterable[float] = ()) -> None:
        """Remember each node's real end of idleness (``until``; none given: never ends)."""
        for n, u in zip(nodes, list(until) or [math.inf] * len(nodes)):
            self.until[n] = u

    def left(self, nodes: Iterable[str], t: float) -> None:
        """Forget the nodes taken back."""
        for n in nodes:
            self.until.pop(n, None)

    def remaining(self, t: float, nodes: Iterable[str]) -> dict[str, float]:
        """The real idle time left of each node whose end is known."""
        return {n: self.until[n] - t for n in nodes if self.until.get(n, math.inf) < math.inf}


class HoleHistory(NoPrediction):
    """Online, from the past only: the hole lengths completed so far. A node idle for ``age`` seconds is
    predicted to stay ``quantile(L - age | L > age)`` more (the conditional residual life of the holes seen;
    ``q`` = 0.5: the median). With fewer than ``min_samples`` longer holes seen it predicts ``age`` more
    (a hole that has lasted long tends to last: the Lindy rule), at least ``floor`` seconds."""

    name = "history"

    def __init__(self, q: float = 0.5, min_samples: int = 20, floor: float = 30.0) -> None:
        self.q, self.min_samples, self.floor = q, min_samples, floor
        self.since: dict[str, float] = {}
        self._new: list[float] = []
        self._sorted = np.zeros(0)

    def joined(self, nodes: Sequence[str], t: float, until: Iterable[float] = ()) -> None:
        """Note when each node's hole began (``until`` is not looked at: the future is unknown)."""
        for n in nodes:
            self.since[n] = t

    def left(self, nodes: Iterable[str], t: float) -> None:
        """Each node's hole ended at ``t``: its length joins the history."""
        for n in nodes:
            s = self.since.pop(n, None)
            if s is not None:
                self._new.append(t - s)

    def lengths(self) -> np.ndarray:
        """The completed hole lengths seen so far, sorted."""
        if self._new:           # merged in, not re-sorted: a replan adds a few lengths to millions
            new = np.sort(np.asarray(self._new, dtype=float))
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, new), new)
            self._new = []
        return self._sorted

    def predict_ages(self, age: np.ndarray) -> np.ndarray:
        """Predicted idle time left of holes that have lasted ``age`` seconds (the class docstring's rule)."""
        L = self.lengths()
        lo = np.searchsorted(L, age, side="right")
        longer = len(L) - lo
        idx = np.minimum(lo + (longer * self.q).astype(np.int64), max(len(L) - 1, 0))
        out = np.where(longer >= self.min_samples, (L[idx] if len(L) else 0.0) - age, age)
        return np.maximum(out, self.floor)

    def remaining(self, t: float, nodes: Iterable[str]) -> dict[str, float]:
        """Predicted idle time left of each node whose hole start is known."""
        known = [n for n in nodes if n in self.since]
        if not known:
            return {}
        age = t - np.array([self.since[n] for n in known])
        return dict(zip(known, self.predict_ages(age).tolist()))


class EasyReservations(HoleHistory):
    """What an EASY-backfill scheduler knows: when the job at the queue head is planned to start (its
    reservation, computed from the requested walltimes of the running jobs). ``plan_times``/``plan_ends``: at
    time plan_times[i] the scheduler's reservation became plan_ends[i] (inf: none). Every idle node is
    predicted to be wanted at the current reservation (the scheduler may pick it for the head job); a node
    the reservation does not bound falls back to the hole history (backfilled jobs are not known ahead)."""

    name = "easy"

    def __init__(self, plan_times: np.ndarray, plan_ends: np.ndarray, **kw: Any) -> None:
        super().__init__(**kw)
        self.plan_times = np.asarray(plan_times, dtype=float)
        self.plan_ends = np.asarray(plan_ends, dtype=float)

    def reservation(self, t: float) -> float:
        """The head job's planned start as the scheduler saw it at ``t`` (inf: no reservation)."""
        i = int(np.searchsorted(self.plan_times, t, side="right")) - 1
        return float(self.plan_ends[i]) if i >= 0 else math.inf

    def remaining(self, t: float, nodes: Iterable[str]) -> dict[str, float]:
        """The hole-history prediction, capped at the current reservation."""
        out = super().remaining(t, nodes)
        r = self.reservation(t)
        if r < math.inf:
            left = max(r - t, 1.0)
            out = {n: min(v, left) for n, v in out.items()}
        return out


def make_predictor(kind: str, schedule: object = None) -> NoPrediction:
    """``kind``: history | easy (needs an EASY ``schedule`` with a reservation timeline) | clairvoyant | none."""
    if kind == "none":
        return NoPrediction()
    if kind == "clairvoyant":
        return Clairvoyant()
    if kind == "history":
        return HoleHistory()
    if kind == "easy":
        tl = getattr(schedule, "reservation_timeline", None)
        if tl is None:
            raise BadValue("--predict easy needs an SWF log replayed with --schedule easy (the reservations "
                           "come from that replay); for idle-interval logs use --predict history")
        return EasyReservations(*tl)
    raise BadValue(f"unknown predictor {kind!r}; choose from {', '.join(PREDICTORS)}")
