"""Cohorts of idle nodes: nodes that became idle together mostly leave together.

A batch job that ends frees its nodes at once, and the scheduler mostly hands them to one waiting job at once
(on the 256-node Summit slice, 83% of the pairs of nodes that joined in one event also left in one event). A
reclaim pauses the job it hits once however many of its nodes go, so a cohort of new nodes adds one expected
reclaim, not one per node: counting nodes (the first hazard model) overcounted it ~3x, kept jobs off new
nodes and made horizon-aware planning lose to horizon-blind planning.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence, Set

import numpy as np


class Cohorts:
    """Which nodes joined the idle pool together, learned from the pools the planner is shown: the nodes first
    seen in one plan joined in one event (the replay plans at every event; the runtime at every change it
    sees, so joins it sees at once count as one cohort). Needs no new input from the runtime; a replay that
    starts again (time going back) starts afresh."""

    def __init__(self) -> None:
        self.key: dict[str, float] = {}
        self.last = -math.inf

    def update(self, pool: Sequence[str], now: float) -> dict[str, float]:
        """The pool shown at ``now``: node -> its cohort (the time it was first seen idle)."""
        if now < self.last:
            self.key = {}
        self.last = now
        self.key = {n: self.key.get(n, now) for n in pool}
        return self.key


class CohortHazard:
    """Expected reclaims within T_fwd that growing a job onto the free nodes adds, per second of T_fwd.

    ``free_remaining``: predicted remaining idle time of the nodes a growing job would get, in that order;
    ``free_cohorts``: their cohorts (None: each node its own). A new cohort is reclaimed within T_fwd with
    probability 1 - exp(-T_fwd / r) (r: its first node's remaining time; a cohort leaves at most once); a
    cohort the job already holds adds nothing (its reclaim pauses the job anyway)."""

    def __init__(self, free_remaining: np.ndarray | None, free_cohorts: Sequence[Hashable] | None,
                 t_fwd: float) -> None:
        free = np.asarray(free_remaining if free_remaining is not None else np.zeros(0), dtype=float)
        keys = list(free_cohorts) if free_cohorts is not None else list(range(len(free)))
        if len(keys) != len(free):
            raise ValueError(f"free_cohorts has {len(keys)} entries for {len(free)} free nodes")
        self.first: dict[Hashable, int] = {}
        for i, k in enumerate(keys):
            self.first.setdefault(k, i)
        idx = np.fromiter(self.first.values(), dtype=np.int64, count=len(self.first))
        self.w = np.zeros(len(free))
        self.w[idx] = -np.expm1(-t_fwd / np.maximum(free[idx], 1e-9)) / t_fwd
        self.cum = np.concatenate([[0.0], np.cumsum(self.w)])

    def __call__(self, own: Set[Hashable], held_size: int, sizes: np.ndarray) -> np.ndarray:
        """``own``: cohorts of the job's nodes; sizes -> hazard of growing from ``held_size`` to each size."""
        extra = np.minimum(np.maximum(sizes.astype(np.int64) - held_size, 0), len(self.w))
        h = self.cum[extra]
        for k in own:               # a cohort it holds already: no new reclaim
            i = self.first.get(k)
            if i is not None:
                h = h - self.w[i] * (extra > i)
        return h
