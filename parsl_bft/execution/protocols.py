"""What the orchestrator needs of an idle pool and of a planner, and the events a pool reports. The planner's is
the planner package's own ``JobPlanner`` (one Protocol for the Controller, the simulator and the runtime): the
planner package knows nothing of Parsl; the runtime knows nothing of the MILP: it only calls ``plan``."""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ..planner.problem import JobPlanner as JobPlanner  # the runtime's seam to the planner, re-exported
from ..topology import Topology


class PoolEventKind(StrEnum):
    """What happened to a pool's nodes (a str: ``ev.kind == "join"`` holds)."""

    JOIN = "join"          # idle nodes arrived: the orchestrator may plan onto them
    NOTICE = "notice"      # they leave soon: checkpoint what runs there
    LEAVE = "leave"        # they are gone: what still runs there is lost

    def __str__(self) -> str:
        return self.value


class NoticeReason(StrEnum):
    """What announced a pilot's notice (a str: stored as such in the event log)."""

    FACILITY_JOB = "a facility job is planned onto it"
    SIGNAL = "scheduler signal"
    PREEMPTED = "preempted"           # the scheduler moved its end forward (Slurm: now + GraceTime)
    WALLTIME = "walltime ends"
    UNUSED = "unused by the plan"     # none of its nodes planned for a job for ``unused_s``: its hours go back

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PoolEvent:
    """One event of an idle pool; a plain string ``kind`` is taken as its ``PoolEventKind``."""

    kind: PoolEventKind
    nodes: tuple[str, ...]
    wall: float               # seconds since the pool started
    until: tuple[float, ...] = ()   # join: wall time each node is expected to leave
    why: str = ""                   # notice: what announced it (a NoticeReason for pilots; "" for emulated nodes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", PoolEventKind(self.kind))


class IdlePool(Protocol):
    """A source of idle nodes: the emulated pool, pilot jobs on a batch system."""

    gang: bool                       # True: one Parsl task per node (pilots); False: all ranks in one task
    demand: int | None               # nodes the jobs could use now (None: unknown); pilots soak no more
    in_use: set[str] | None          # its nodes the plan gives a job now (None: unknown); pilots idle long go back
    stop_s: float | None             # how long a fragment takes to stop and save (None: not seen yet)
    topology: Topology | None        # the network's groups of its nodes, where known

    def start(self) -> None:
        """Start the pool's clock (and clear what an earlier run left)."""

    def poll(self) -> list[PoolEvent]:
        """The events due now."""

    def release(self, nodes: Collection[str]) -> None:
        """The orchestrator is done with these nodes on notice: give them back early."""

    def stop(self) -> None:
        """Give every node back."""

    def executor_label(self, node: str) -> str | None:
        """The Parsl executor whose workers run on ``node``; None: the site's one executor."""


class PilotExecutor(Protocol):
    """What a PilotPool uses of a Parsl HighThroughputExecutor: its blocks (pilots), scaling out through its
    provider, and the worker pools connected to its interchange."""

    label: str
    provider: Any
    blocks_to_job_id: dict[str, str]

    def scale_out_facade(self, n: int) -> Sequence[str]:
        """Submit ``n`` more blocks through the provider."""

    def connected_managers(self) -> list[dict[str, Any]]:
        """The worker pools connected now (``block_id`` says whose)."""
