"""Turn sizes into node ids without migration. Which nodes is a hook (topology-aware placement subclasses it)."""
from __future__ import annotations

from .problem import JobState


class Placement:
    """Default: a shrinking job gives back the nodes that will leave soonest (then the ones it got last);
    a growing job takes the free nodes that will stay idle longest (then in pool order)."""

    def release(self, job: JobState, count: int, remaining: dict[str, float]) -> list[str]:
        """The ``count`` nodes a shrinking ``job`` gives back."""
        order = sorted(range(job.size), key=lambda i: (remaining.get(job.nodes[i], float("inf")), -i))
        return [job.nodes[i] for i in order[:count]]

    def grow(self, job: JobState, free: list[str], count: int, remaining: dict[str, float]) -> list[str]:
        """The ``count`` nodes of ``free`` a growing ``job`` takes."""
        return _longest_lived(free, count, remaining)

    def grow_order(self, jobs: list[JobState], sizes: dict[str, int]) -> list[JobState]:
        """The order growing jobs pick their nodes in."""
        return jobs

    def observe(self, alloc: dict[str, tuple[str, ...]]) -> None:
        """Who holds what, before the first grow and after each (topology-aware placements need it)."""


def place(jobs: list[JobState], sizes: dict[str, int], pool: list[str], placement: Placement,
          remaining: dict[str, float] | None = None) -> dict[str, tuple[str, ...]]:
    """The nodes each job holds at its new size in ``sizes``: shrinking jobs give nodes back, growing jobs take
    free ones (``placement`` says which); no job moves a node it keeps."""
    remaining = remaining or {}
    held = {n for j in jobs for n in j.nodes}
    alloc: dict[str, tuple[str, ...]] = {}
    released: list[str] = []
    for j in jobs:
        k = sizes.get(j.name, 0)
        if k < j.size:
            gone = set(placement.release(j, j.size - k, remaining))
            alloc[j.name] = tuple(n for n in j.nodes if n not in gone)
            released.extend(n for n in j.nodes if n in gone)
        else:
            alloc[j.name] = j.nodes
    free = [n for n in pool if n not in held] + released
    placement.observe(alloc)
    default_grow = type(placement).grow is Placement.grow
    if default_grow and remaining:   # every job takes the head of one order: sort once (O(N log N), not O(J N));
        free = _longest_lived(free, len(free), remaining)    # no lifetimes known: that order is the pool's
    for j in placement.grow_order([j for j in jobs if sizes.get(j.name, 0) > j.size], sizes):
        k = sizes[j.name]
        if k > j.size:
            got = free[:k - j.size] if default_grow else placement.grow(j, free, k - j.size, remaining)
            if len(got) < k - j.size:
                raise RuntimeError(f"placement: {j.name} needs {k - j.size} more nodes, {len(free)} free")
            if default_grow:
                free = free[len(got):]
            else:
                taken = set(got)
                free = [n for n in free if n not in taken]
            alloc[j.name] = j.nodes + tuple(got)
            placement.observe(alloc)
    return alloc


def _longest_lived(free: list[str], count: int, remaining: dict[str, float]) -> list[str]:
    """The ``count`` free nodes expected to stay idle longest (ties: pool order)."""
    pos = {n: i for i, n in enumerate(free)}
    return sorted(free, key=lambda n: (-remaining.get(n, float("inf")), pos[n]))[:count]
