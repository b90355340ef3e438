"""The pilot pool's records: each pilot's state and what one poll of the scheduler learned (pilot_pool.py)."""
from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .commands import NoJobId, SchedulerError
from .protocols import NoticeReason

logger = logging.getLogger("parsl_bft.execution.pilot_pool")     # what the pool skipped is in its own log

# What a scheduler command can end with besides its answer: it failed (SchedulerError), could not start (OSError),
# hung (TimeoutExpired) or answered without a job id (NoJobId). The facility's trouble, not ours: one line in the
# log, and the next poll tries again.
SCHEDULER_TROUBLE = (SchedulerError, NoJobId, OSError, subprocess.SubprocessError)


def skipped(what: str, e: Exception, level: int = logging.WARNING) -> None:
    """Log a poll step that failed and is skipped. Every step reads the scheduler's answers (parsed: an odd one
    can raise anywhere in a parser) or calls into Parsl, so each keeps a broad catch: a bug there must not end a
    run that holds the facility's nodes. But only SCHEDULER_TROUBLE is expected; anything else is logged as the
    bug it is, with its traceback (at ERROR, whatever ``level``), not as one more "skipped" line."""
    if isinstance(e, SCHEDULER_TROUBLE):
        logger.log(level, "%s: %s", what, e)
    else:
        logger.error("%s: unexpected %s (a bug; its traceback follows)", what, type(e).__name__, exc_info=e)

Where = dict[str, tuple[tuple[str, ...], float | None]]    # job id -> (its nodes, when its walltime ends)
LaneBlock = tuple[str, str]                                # (lane, Parsl block id) of a pilot


class PilotState(StrEnum):
    """Where one pilot stands, as the pool sees it."""

    QUEUED = "queued"        # submitted; its nodes have not joined (queued, or running while worker pools connect)
    RUNNING = "running"      # joined: its nodes are the orchestrator's
    NOTICED = "noticed"      # joined and on notice: no new tasks; given back when released or claimed
    LEFT = "left"            # left us (ended or worker pools lost); the scheduler may still run it: cancel it
    GONE = "gone"            # ended, cancelled or given back: never looked at again

    def __str__(self) -> str:
        return self.value


JOINED = (PilotState.RUNNING, PilotState.NOTICED)
OVER = (PilotState.LEFT, PilotState.GONE)


@dataclass
class Pilot:
    """The pool's record of one pilot job."""

    job_id: str
    state: PilotState = PilotState.QUEUED
    nodes: tuple[str, ...] = ()         # joined: its nodes
    release_at: float | None = None     # when to cancel it (a facility job wants a node, or the orchestrator is
    #                                     done with it on notice); None: not planned
    cancelled: bool = False             # the cancel for ``release_at`` went out
    looked: bool = False                # its worker pool's connection made us survey at once
    recorded: bool = False              # written to this run's ledger
    unused_since: float | None = None   # joined and none of its nodes planned for a job since then
    end: float | None = None            # joined: when its walltime ends, as the scheduler said then


@dataclass
class Survey:
    """What one poll learned: worker pools connected per (lane, block), and where the pilots run."""

    managers: dict[LaneBlock, int]
    where: Where


@dataclass
class Changes:
    """What one poll found changed: pilots whose nodes joined, got their notice, or left."""

    joined: list[tuple[str, tuple[str, ...], float | None]] = field(default_factory=list)
    noticed: list[tuple[str, NoticeReason]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def hold_block(executor: Any, block_id: str) -> None:
    """Send no more tasks to the worker pools of one block of a HighThroughputExecutor. HTEX only learns that a
    worker pool died when its heartbeats stop; until then it would still send it tasks. This is how Parsl's
    own scale-in holds blocks; Parsl has no public call for it, so this is the one place that makes it (the name
    is checked by tests/unit/test_upstream_contracts.py)."""
    executor._hold_block(block_id)
