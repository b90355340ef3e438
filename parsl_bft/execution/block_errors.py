"""Parsl's block error policy, for pilots: a pilot that ends is normal, a pilot that cannot start is not.

Parsl's default handler counts FAILED and MISSING blocks and, with ``init_blocks=0``, marks the executor broken
as soon as every block so far has ended that way - and HTEX reports a pilot that ran into its walltime and left
the scheduler's view as MISSING. Here a block that was ever seen running (or whose worker pool connected) may end
in any state: walltime, preemption, cancel, node failure are how idle windows close. A block that reaches a
terminal state other than TIMEOUT or SCALED_IN without ever running failed at start; ``threshold`` of those in a
row, with no pilot that ran in between, mean a broken setup (a bad worker_init, partition or account), and the
executor is put in a bad state with the scheduler's reasons and the tail of the pilots' output.
"""
from __future__ import annotations

import logging
import weakref
from pathlib import Path

from parsl.executors import HighThroughputExecutor
from parsl.executors.status_handling import BlockProviderExecutor
from parsl.jobs.states import JobState, JobStatus

from ..errors import ParslBftError
from .pilot import PilotProvider

logger = logging.getLogger(__name__)

THRESHOLD = 3
_RAN: weakref.WeakKeyDictionary[BlockProviderExecutor, set[str]] = weakref.WeakKeyDictionary()
_NORMAL_END = (JobState.TIMEOUT, JobState.SCALED_IN)


class PilotsFailing(ParslBftError):
    """Pilots of one executor failed at start again and again."""


def _output_tail(executor: BlockProviderExecutor, block: str, lines: int = 5) -> str:
    """The last lines a pilot printed (its scheduler output file), for the error message; "" when unknown."""
    job = executor.blocks_to_job_id.get(block)
    provider = executor.provider
    d = provider.script_dir if isinstance(provider, PilotProvider) else None
    if job is None or d is None:
        return ""
    out = Path(d) / f"{job}.out"
    try:
        tail = out.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return f" (output {out}: " + " | ".join(tail) + ")" if tail else ""


def pilot_block_error_handler(executor: BlockProviderExecutor, status: dict[str, JobStatus],
                              threshold: int = THRESHOLD) -> None:
    """Parsl's ``block_error_handler`` for pilot executors: a bad state only after ``threshold`` pilots in a
    row ended without ever running (see the module's docstring)."""
    ran = _RAN.setdefault(executor, set())
    ran.update(b for b, s in status.items() if s.state in (JobState.RUNNING, JobState.HELD))
    try:
        if isinstance(executor, HighThroughputExecutor):
            ran.update(str(m.get("block_id")) for m in executor.connected_managers())
    except Exception:            # an executor not started yet (or Parsl's own error, of any type): no news
        logger.debug("connected managers of %s not read", executor.label, exc_info=True)
    streak: list[str] = []
    for b in sorted((b for b, s in status.items() if s.terminal), key=lambda b: int(b) if b.isdigit() else 0):
        if b in ran or status[b].state in _NORMAL_END:
            streak = []
        else:
            streak.append(b)
    if len(streak) >= threshold and not executor.bad_state_is_set:
        why = "; ".join(f"block {b}: {status[b].state.name} {status[b].message or ''}".strip()
                        + _output_tail(executor, b) for b in streak[-threshold:])
        executor.set_bad_state_and_fail_all(PilotsFailing(
            f"{len(streak)} pilots in a row failed before their worker pool ever ran (check the site file's "
            f"worker_init, partition/queue and account): {why}"))
