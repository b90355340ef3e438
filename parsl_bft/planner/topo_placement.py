"""Topology-aware placements for idle nodes (``Placement`` subclasses; no Parsl, no MILP).

- ``CompactPlacement``: a job spans as few groups as it can: it grows into its own groups, then into the groups
  with the most free nodes; it shrinks out of the groups where it has the fewest nodes.
- ``BcoPlacement``: SJF-BCO's rule at node granularity (a node holds one job, so contention is on the links out
  of a group). Jobs grow smallest first. A job that fits into one group's free nodes is small (the paper's
  kappa becomes the largest free fragment, which changes as nodes come and go): it takes its own group if that
  fits, else the group whose free nodes fit it most tightly (FA-FFP: small jobs fill fragments and keep big
  groups whole). A larger job is LBSGF: groups ordered by how many spread jobs already use them (then most
  free first), the fewest such groups holding >= lambda x the nodes it needs, most free first.
Both shrink like ``CompactPlacement``.
"""
from __future__ import annotations

from ..errors import BadValue
from ..topology import Topology
from .placement import Placement
from .problem import JobState


class CompactPlacement(Placement):
    """Span as few topology groups as possible (the module docstring says how)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def release(self, job: JobState, count: int, remaining: dict[str, float]) -> list[str]:
        """Give back nodes from the groups where the job has the fewest, soonest-leaving first."""
        by = self.topology.by_group(job.nodes)
        order = sorted(range(job.size), key=lambda i: (len(by[self.topology.group(job.nodes[i])]),
                                                       remaining.get(job.nodes[i], float("inf")), -i))
        return [job.nodes[i] for i in order[:count]]

    def _free_groups(self, free: list[str], remaining: dict[str, float]) -> dict[str, list[str]]:
        by = self.topology.by_group(free)
        pos = {n: i for i, n in enumerate(free)}
        return {g: sorted(ns, key=lambda n: (-remaining.get(n, float("inf")), pos[n])) for g, ns in by.items()}

    def _fill(self, groups: list[str], free_by: dict[str, list[str]], count: int) -> list[str]:
        out: list[str] = []
        for g in groups:
            out += free_by[g][: count - len(out)]
            if len(out) == count:
                break
        return out

    def grow(self, job: JobState, free: list[str], count: int, remaining: dict[str, float]) -> list[str]:
        """Take free nodes in the job's own groups first, then in the groups with the most free nodes."""
        free_by = self._free_groups(free, remaining)
        own = set(self.topology.group(n) for n in job.nodes)
        order = sorted(free_by, key=lambda g: (g not in own, -len(free_by[g]), g))
        return self._fill(order, free_by, count)


class BcoPlacement(CompactPlacement):
    """SJF-BCO's placement at node granularity (the module docstring says how)."""

    def __init__(self, topology: Topology, lam: float = 1.0) -> None:
        if lam < 1:
            raise BadValue(f"lambda must be >= 1, got {lam}")
        super().__init__(topology)
        self.lam = lam
        self.alloc: dict[str, tuple[str, ...]] = {}

    def grow_order(self, jobs: list[JobState], sizes: dict[str, int]) -> list[JobState]:
        """Smallest new size first (SJF)."""
        return sorted(jobs, key=lambda j: (sizes[j.name], j.name))

    def observe(self, alloc: dict[str, tuple[str, ...]]) -> None:
        """Remember who holds what: spread jobs make groups busy for the next grow."""
        self.alloc = dict(alloc)

    def _spread_users(self, me: str) -> dict[str, int]:
        """Per group: how many jobs spread over several groups (other than ``me``) use it."""
        use: dict[str, int] = {}
        for name, nodes in self.alloc.items():
            if name == me or not nodes:
                continue
            gs = {self.topology.group(n) for n in nodes}
            if len(gs) > 1:
                for g in gs:
                    use[g] = use.get(g, 0) + 1
        return use

    def grow(self, job: JobState, free: list[str], count: int, remaining: dict[str, float]) -> list[str]:
        """A small job fills the tightest fitting group (FA-FFP); a large one the least contended (LBSGF)."""
        free_by = self._free_groups(free, remaining)
        own = {self.topology.group(n) for n in job.nodes}
        fits = [g for g in free_by if len(free_by[g]) >= count]
        if fits:      # small: FA-FFP
            g = min(fits, key=lambda g: (g not in own, len(free_by[g]), g))
            return free_by[g][:count]
        users = self._spread_users(job.name)
        order = sorted(free_by, key=lambda g: (g not in own, users.get(g, 0), -len(free_by[g]), g))
        chosen, held = [], 0
        for g in order:
            chosen.append(g)
            held += len(free_by[g])
            if held >= self.lam * count:
                break
        chosen.sort(key=lambda g: (g not in own, -len(free_by[g]), g))
        got = self._fill(chosen, free_by, count)
        return got if len(got) == count else self._fill(order, free_by, count)


PLACEMENTS = ("oblivious", "compact", "sjf-bco")


def make_placement(name: str, topology: Topology | None) -> Placement:
    """A placement by its name in ``PLACEMENTS`` (compact and sjf-bco need a ``topology``)."""
    if name not in PLACEMENTS:
        raise BadValue(f"unknown placement {name!r}; choose from {', '.join(PLACEMENTS)}")
    if name == "oblivious":
        return Placement()
    if topology is None:
        raise BadValue(f"placement {name!r} needs a topology")
    return CompactPlacement(topology) if name == "compact" else BcoPlacement(topology)
