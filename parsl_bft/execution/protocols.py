"""What the orchestrator needs of an idle pool and of a planner (the planner package knows nothing of Parsl;
the runtime knows nothing of the MILP: it only calls ``plan``)."""
from __future__ import annotations

from typing import Protocol

from ..planner.problem import JobState, Plan


class IdlePool(Protocol):
    gang: bool                       # True: one Parsl task per node (pilots); False: all ranks in one task
    demand: int | None               # nodes the jobs could use now (None: unknown); pilots soak no more

    def start(self) -> None: ...

    def poll(self) -> list: ...      # PoolEvents due now: join | notice | leave

    def release(self, nodes) -> None: ...   # done with these nodes on notice: give them back early

    def stop(self) -> None: ...


class Planner(Protocol):
    def plan(self, jobs: list[JobState], pool: list[str], now: float = 0.0, remaining=None) -> Plan: ...
