"""Which nodes of our running pilots the facility's waiting jobs need back, read from one survey of the queue
(a ``Snapshot``): the pilot pool gives their pilots back (``PilotPool._claims``)."""
from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .pilot import QueueJob, Snapshot  # pilot.py imports this module

Held = tuple[float, str, tuple[str, ...], float]      # a running pilot: (start, job id, nodes, walltime end)


def claimed(snap: Snapshot, ours: Collection[str], yielded: dict[str, set[str]], within_s: float, now: float,
            poll_s: float) -> set[str]:
    """Nodes of our running pilots (job ids ``ours``) that a waiting job (not one of ours) needs back. A job
    needs a node when
    - it is planned onto it within ``within_s``, unless the scheduler is already preempting pilots of ours
      enough for it (their end moved forward): those nodes are the job's. Slurm's preemption may pick another
      pilot than the one its plan names; giving that one back as well cost a second pilot, twice in one replay;
    - it is planned onto it no later than the pilot's walltime ends: the pilot is what it waits for (it arrived
      after the pilot started, and nothing preempts the pilot);
    - it is planned later or elsewhere, but would start now on the idle nodes and our pilots' nodes
      (``_in_the_way``): without pilots it would have started at once. Pilots go in turn, the youngest first,
      until the job fits. A job is given pilots once (``yielded``: job id -> the pilots given, kept by the caller
      while the job waits), so one that still waits for other reasons does not take every new one."""
    running = _running(snap, ours)
    held = sorted(((job.start or 0.0, job.job_id, job.nodes, job.end) for job in running
                   if job.end is not None and job.nodes), reverse=True)
    end_of = {n: end for _, _, nodes, end in held for n in nodes}
    out: set[str] = set()
    free = len(snap.idle)
    taking = _being_preempted(running)
    spare = len(taking)
    waiting = sorted((j for j in snap.waiting() if j.job_id not in ours and j.start is not None),
                     key=lambda j: j.start or 0.0)
    for gone in set(yielded) - {j.job_id for j in waiting}:    # started or left the queue: forgotten
        del yielded[gone]
    for i, j in enumerate(waiting):
        assert j.start is not None
        size = max(j.size, len(j.nodes))
        if j.start <= now + within_s:
            pilots_planned = [n for n in j.nodes if n in end_of]
            if pilots_planned and len(pilots_planned) <= spare:
                spare -= len(pilots_planned)
                out.update(n for n in pilots_planned if n in taking)
            else:
                out.update(j.nodes)
        elif any(j.start <= end_of[n] + poll_s + 1 for n in j.nodes if n in end_of):
            out.update(n for n in j.nodes if n in end_of)       # a survey after the pilot's end still shows that plan
        elif j.job_id in yielded:
            out.update(n for _, p, nodes, _ in held if p in yielded[j.job_id] for n in nodes)
        elif (need := size - free) > 0:
            pilots = [p for p in _in_the_way(j, waiting[:i], held, snap, now) if not out.issuperset(p[2])]
            given = _first_holding(need, pilots)
            if given:
                yielded[j.job_id] = {p for _, p, _, _ in given}
                out.update(n for _, _, nodes, _ in given for n in nodes)
        free = max(0, free - size)
    return out


def _running(snap: Snapshot, ours: Collection[str]) -> list[QueueJob]:
    """Our pilots that run now. The queue lists a finished pilot for minutes (Slurm's MinJobAge): counted, it
    would give a job nodes it cannot have, and its node, taken since by a new pilot, back at every survey."""
    return [job for j in ours if (job := snap.jobs.get(j)) is not None and job.state in snap.running_states]


def _being_preempted(running: list[QueueJob]) -> set[str]:
    """Nodes of our ``running`` pilots whose end the scheduler moved forward (a preempted Slurm job stays
    RUNNING, its end now + GraceTime): start + time limit is later than the end the queue shows."""
    return {n for job in running if job.start is not None and job.end is not None and job.limit_s is not None
            and job.end < job.start + job.limit_s - 1 for n in job.nodes}


def _in_the_way(j: QueueJob, before: list[QueueJob], held: list[Held], snap: Snapshot, now: float) -> list[Held]:
    """The pilots (of ``held``, youngest first) that keep ``j`` from starting now. Where its time limit is known,
    as backfill would see it: a pilot whose nodes no job planned before it (``before``), nor a reservation,
    takes within the limit; else the pilots only if one holds a node past j's planned start."""
    assert j.start is not None
    if j.limit_s is None:
        return held if any(end > j.start for *_, end in held) else []
    until = now + j.limit_s
    taken = {n for k in before if k.start is not None and k.start < until for n in k.nodes}
    taken.update(n for n, start in snap.reserved.items() if start < until)
    return [p for p in held if taken.isdisjoint(p[2])]


def _first_holding(need: int, pilots: list[Held]) -> list[Held]:
    """The first of ``pilots`` that together hold ``need`` nodes; none if they cannot."""
    given, n = [], 0
    for p in pilots:
        if n >= need:
            break
        given.append(p)
        n += len(p[2])
    return given if n >= need else []
