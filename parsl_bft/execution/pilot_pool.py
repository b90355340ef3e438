"""Live idle capacity on a batch system: pilot jobs, launched as the blocks of a Parsl HighThroughputExecutor
whose provider is a ``PilotProvider`` (so Parsl's own bookkeeping - status polling, cancelling at shutdown -
covers them).

Each pilot the pool has seen has a record (``Pilot``) with its ``PilotState``::

    QUEUED --(running and every node's worker pool connected)--> RUNNING --(notice)--> NOTICED
      |                                                             |                    |
      +--(ended, withdrawn, claimed before it joined)--> GONE <-----+--(left: pilot ended or worker pools lost)
                                                          ^               (LEFT first while the scheduler
                                                          +-- LEFT <------ may still run it: cancelled then)

``poll`` is one pass of steps: survey (claims, worker pools, where pilots run), cancel what is due, classify
(joins, notices, leaves), give back what left, and - every ``probe_s`` - soak up the holes not yet covered.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from parsl.jobs.states import JobState

from ..errors import BadValue
from ..topology import Topology
from .lanes import Lanes
from .pilot import Hole, PilotProvider, PilotShape, PilotsRefused
from .pilot_records import (
    JOINED,
    OVER,
    Changes,
    LaneBlock,
    Pilot,
    PilotState,
    Survey,
    Where,
    hold_block,
    skipped,
)
from .protocols import NoticeReason, PilotExecutor, PoolEvent, PoolEventKind

logger = logging.getLogger(__name__)

class PilotPool:
    """Live idle capacity on a batch system: pilot jobs of an HTEX executor whose provider is a PilotProvider.

    It keeps one pilot per hole (up to ``max_nodes``; several holes a pilot when the facility caps our jobs).
    A pilot's nodes join once it runs AND each node's worker pool has connected. They get a notice when the
    scheduler signals the pilot, when its walltime ends within ``notice_s``, or when a waiting facility job is
    planned to start on them: then the pilot is cancelled ``release_s`` later (time to checkpoint), so the
    facility job does not wait for a pilot; other noticed pilots go when the orchestrator ``release``s their
    nodes. They leave when the pilot stops running or its worker pool is lost.
    HTEX decides which node runs which task, so a fragment of n ranks is n one-rank tasks (``gang``) and the
    orchestrator's books follow where the ranks landed. With the network's groups (``topology``, else what the
    provider's scheduler says) and a provider that can aim pilots, pilots go to hole nodes group by group, one
    executor per group (``lanes``): ``executor_label(node)`` is where a task meant for ``node`` goes.
    ``hold(executor, block)`` stops new tasks to a block's worker pools (default: ``hold_block``).
    """

    gang: bool = True
    demand: int | None = None   # set by the orchestrator: nodes its jobs could use; no pilots beyond that
    in_use: set[str] | None = None  # ... and the nodes its plan gives a job now
    stop_s: float | None = None     # ... and how long a fragment takes to stop and save (None: not seen yet)

    def __init__(self, executor: PilotExecutor, *, max_nodes: int = 64, probe_s: float = 5.0, poll_s: float = 1.0,
                 notice_s: float | None = None, release_s: float = 3.0, clock: Callable[[], float] = time.time,
                 topology: Topology | None = None, new_executor: Callable[[str], PilotExecutor] | None = None,
                 hold: Callable[[Any, str], None] = hold_block, max_per_minute: int | None = None,
                 unused_s: float | None = None):
        if max_nodes < 1:
            raise BadValue(f"max_nodes must be >= 1, got {max_nodes}")
        if max_per_minute is not None and max_per_minute < 1:
            raise BadValue(f"max_per_minute must be >= 1, got {max_per_minute}")
        self.executor = executor
        self.provider: PilotProvider = executor.provider
        self.topology: Topology | None = topology if topology is not None else self.provider.topology()
        self.lanes: Lanes | None = None
        if self.topology is not None and self.provider.can_target and new_executor is not None:
            self.lanes = Lanes(executor, self.topology, new_executor)
        self._lane_of: dict[str, str] = {}     # joined node -> the group (lane) of the pilot holding it
        self.max_nodes, self.probe_s, self.poll_s, self.clock = max_nodes, probe_s, poll_s, clock
        self.notice_s = float(self.provider.notice_s if notice_s is None else notice_s)
        self.release_s = release_s
        self._hold_fn = hold
        self._t0 = clock()
        self._last_probe = self._last_poll = -math.inf
        self._book: dict[str, Pilot] = {}      # job id -> its record, for every pilot seen
        self.max_per_minute = max_per_minute
        self.unused_s = unused_s                # a joined pilot the plan leaves unused this long is given back
        self._submitted: deque[float] = deque()  # when each pilot of the last minute was submitted

    def start(self) -> None:
        """Start the pool's clock and cancel the pilots a dead earlier run of the state directory left."""
        self._t0 = self.clock()
        self._cancel_orphans()

    # --- the records ---------------------------------------------------------------------------------------
    def states(self) -> dict[str, PilotState]:
        """job id -> state of every pilot the pool has seen."""
        return {j: p.state for j, p in self._book.items()}

    def pilot(self, job_id: str) -> Pilot:
        """The record of a pilot (a new one, QUEUED, for a job id not seen before)."""
        if job_id not in self._book:
            self._book[job_id] = Pilot(job_id)
        return self._book[job_id]

    def _state(self, job_id: str) -> PilotState:
        p = self._book.get(job_id)
        return PilotState.QUEUED if p is None else p.state

    def _joined(self) -> dict[str, Pilot]:
        """The pilots whose nodes are ours (RUNNING or NOTICED)."""
        return {j: p for j, p in self._book.items() if p.state in JOINED}

    def _set(self, job_ids: Iterable[str], state: PilotState) -> None:
        for j in job_ids:
            self.pilot(j).state = state

    # --- the pilot ledger: a file per run and site, beside the run's pilot scripts ---------------------------
    def _scripts(self) -> Path | None:
        """Parsl's <run_dir>/submit_scripts (runs of one state directory are its siblings), else None."""
        d = self.provider.script_dir
        return Path(d) if d and Path(d).name == "submit_scripts" else None

    def _record(self, pilots: Iterable[str]) -> None:
        """Every pilot's job id, as it is submitted: what a later run of this state directory cancels if this
        orchestrator dies before it gives its pilots back."""
        new = [j for j in pilots if not self.pilot(j).recorded]
        scripts = self._scripts()
        if new and scripts is not None:
            for j in new:
                self.pilot(j).recorded = True
            scripts.mkdir(parents=True, exist_ok=True)
            with open(scripts / f"pilots-{self.executor.label}", "a") as f:
                f.write("".join(f"{j}\n" for j in new))

    def _cancel_orphans(self) -> None:
        """Pilots of this site from earlier runs in the same state directory (runinfo/*): their orchestrator is
        dead - this one holds the directory's lock. Still queued, one would start on a hole for nobody; still
        running, it holds its node until its worker pool gives up on the dead interchange. Cancel them (one
        survey, one scancel/qdel) and mark their ledger done."""
        scripts = self._scripts()
        if scripts is None:
            return
        ledgers = [f for f in scripts.parent.parent.glob(f"*/submit_scripts/pilots-{self.executor.label}")
                   if f.parent != scripts]
        ids = sorted({j for f in ledgers for j in f.read_text().split()})
        # the scheduler busy: they end by themselves (their interchange is gone); the ledgers stay for next time
        if not self._cancel_listed(ids, "of an earlier run of this state directory"):
            return
        for f in ledgers:
            f.rename(f.with_name(f.name + ".done"))

    def _executors(self) -> dict[str, PilotExecutor]:
        return {"": self.executor} if self.lanes is None else dict(self.lanes.executors)

    def _pilots(self) -> dict[str, LaneBlock]:
        """job id -> (lane, block) of the pilots not known to have ended."""
        return {str(j): (lane, str(b)) for lane, ex in self._executors().items()
                for b, j in list(ex.blocks_to_job_id.items()) if self._state(str(j)) not in OVER}

    def executor_label(self, node: str) -> str | None:
        """The label of the executor whose worker pools run on ``node``'s group; None: the pool's one executor."""
        if self.lanes is None or node not in self._lane_of:
            return None
        label: str = self.lanes.executors[self._lane_of[node]].label
        return label

    # --- one poll, step by step ------------------------------------------------------------------------------
    def poll(self) -> list[PoolEvent]:
        """The pool's events since the last poll (the scheduler is asked every ``poll_s``, not every loop):
        notices first, then leaves, then joins; every ``probe_s`` new pilots for the holes not yet covered."""
        now = self.clock()
        if now - self._last_poll < self.poll_s:
            return []
        self._last_poll = now
        pilots = self._pilots()
        probe = now - self._last_probe >= self.probe_s
        if probe:
            self._last_probe = now
        claimed = self._claims(pilots, now)
        self._cancel_due(pilots, now)
        seen = self._survey(pilots)
        if seen is None:
            return []
        self._cancel_claimed_early(pilots, seen.where, claimed)
        changes = self._changes(pilots, seen, now)
        for jid in [j for j, _ in changes.noticed] + changes.left:   # no new tasks for their worker pools
            self._hold(pilots[jid])
        w = now - self._t0
        events = self._notices(changes.noticed, w) + self._leaves(changes.left, w)
        self._give_back_unused()
        events += self._joins(changes.joined, pilots, w)
        if probe:                                    # after the notices: their replacements start now
            try:
                self._soak({j: b for j, b in pilots.items() if self._state(j) not in OVER})
            except Exception as e:                   # Parsl's scale-out and the provider's sbatch/qsub
                skipped("pilot submission skipped", e)
            self._record(self._pilots())
            if self.provider.refused is not None:    # Parsl recorded each refusal as a failed block
                raise PilotsRefused(f"executor {self.executor.label}: {self.provider.refused}")
        return events

    def _claims(self, pilots: dict[str, LaneBlock], now: float) -> set[str]:
        """Nodes a waiting facility job is planned onto soon; a joined pilot holding one is cancelled
        ``release_s`` from now. Read at every poll (the survey is taken anyway): the facility job gets its node
        soon."""
        if not pilots:
            return set()
        claimed: set[str] = set()
        try:
            claimed = self.provider.claimed(self.probe_s + self.release_s)
        except Exception as e:           # the scheduler's queue, parsed
            skipped("claim check skipped", e)
        for p in self._joined().values():
            if claimed & set(p.nodes) and p.release_at is None:
                p.release_at = now + self.release_s
        return claimed

    def _cancel_due(self, pilots: dict[str, LaneBlock], now: float) -> None:
        """Cancel the pilots whose release time has come (tried again at the next poll when it fails)."""
        due = [j for j in pilots if (p := self._book.get(j)) is not None and p.release_at is not None
               and not p.cancelled and p.release_at <= now]
        if not due:
            return
        try:
            self.provider.cancel(due)
            for j in due:
                self.pilot(j).cancelled = True
        except Exception as e:           # scancel/qdel (Slurm's cancel surveys the queue first, parsed)
            skipped("pilot cancel failed", e)

    def _survey(self, pilots: dict[str, LaneBlock]) -> Survey | None:
        """The worker pools connected to each executor, and where the pilots run; None when the scheduler or an
        interchange did not answer (no news is not "every node left")."""
        try:
            managers: dict[LaneBlock, int] = {}
            for lane, ex in self._executors().items():
                for m in ex.connected_managers():
                    key = (lane, str(m.get("block_id")))
                    managers[key] = managers.get(key, 0) + 1
            started = [j for j, b in pilots.items() if b in managers and self._state(j) not in JOINED
                       and not self.pilot(j).looked]
            if started:     # a worker pool connected, so its pilot runs: look now, not at the next survey
                for j in started:
                    self.pilot(j).looked = True
                self.provider.snapshot(max_age_s=self.poll_s)
            where: Where = self.provider.where(list(pilots)) if pilots else {}
        except Exception as e:           # the interchanges' worker pools and the scheduler's queue, parsed
            skipped("pilot poll skipped", e)
            return None
        return Survey(managers, where)

    def _cancel_claimed_early(self, pilots: dict[str, LaneBlock], where: Where, claimed: set[str]) -> None:
        """A pilot that has not joined yet runs nothing to checkpoint: give a claimed node back at once (it is
        dropped from ``pilots``; tried again at the next poll when the cancel fails)."""
        early = [j for j in pilots if self._state(j) not in JOINED and j in where and claimed & set(where[j][0])]
        if not early:
            return
        try:
            self.provider.cancel(early)
            self._set(early, PilotState.GONE)
            for j in early:
                self._hold(pilots[j])
                del pilots[j]
        except Exception as e:           # as in _cancel_due (_hold catches its own)
            skipped("pilot cancel failed", e)

    def _changes(self, pilots: dict[str, LaneBlock], seen: Survey, now: float) -> Changes:
        """Which pilots join (running, every node's worker pool connected), get their notice, or leave (no
        longer running, or their worker pools are gone)."""
        out = Changes()
        for jid, block in pilots.items():
            nodes, end = seen.where.get(jid, ((), None))
            state = self._state(jid)
            if state in JOINED:
                if not (nodes and seen.managers.get(block)):
                    out.left.append(jid)
                elif state is PilotState.RUNNING and (why := self._notice(jid, end, now)) is not None:
                    out.noticed.append((jid, why))
            elif nodes and seen.managers.get(block, 0) >= len(nodes):
                out.joined.append((jid, nodes, end))
        return out

    def _notice(self, jid: str, end: float | None, now: float) -> NoticeReason | None:
        """Why a running pilot gets its notice now, or None."""
        if self.pilot(jid).release_at is not None:
            return NoticeReason.FACILITY_JOB
        if self.provider.noticed(jid):
            return NoticeReason.SIGNAL
        if end is not None and now >= end - self.walltime_lead_s():
            joined_end = self.pilot(jid).end
            return NoticeReason.PREEMPTED if joined_end is not None and end < joined_end - 1 else NoticeReason.WALLTIME
        # the scheduler's own walltime signal only where the end is unknown: Slurm sends it up to 60 s early,
        # which would end a 1-minute pilot's use of its node as it joins
        if end is None and self.provider.walltime_signalled(jid):
            return NoticeReason.WALLTIME
        return NoticeReason.UNUSED if self._unused_too_long(self.pilot(jid), now) else None

    def walltime_lead_s(self) -> float:
        """How long before its walltime ends a pilot gets its notice: ``notice_s``, or, once the orchestrator has
        seen how long a stop takes, twice that plus three polls (the notice seen, the release, the cancel), if
        less. A short pilot then trains until shortly before its end instead of handing its last ``notice_s``
        seconds to nobody; a stop that still runs late saves on the scheduler's SIGTERM."""
        if self.stop_s is None:
            return self.notice_s
        return min(self.notice_s, 2 * self.stop_s + 3 * self.poll_s)

    def _unused_too_long(self, p: Pilot, now: float) -> bool:
        """Whether none of the pilot's nodes has been planned for a job for ``unused_s``: its allocation hours
        are charged for nothing (it gets a notice, and goes once the orchestrator lets it go)."""
        if self.unused_s is None or self.in_use is None or self.in_use & set(p.nodes):
            p.unused_since = None
            return False
        if p.unused_since is None:
            p.unused_since = now
        return now - p.unused_since >= self.unused_s

    def _notices(self, noticed: list[tuple[str, NoticeReason]], w: float) -> list[PoolEvent]:
        """One notice event per reason."""
        events = []
        for why in sorted({why for _, why in noticed}):
            ids = [j for j, y in noticed if y == why]
            self._set(ids, PilotState.NOTICED)
            events.append(PoolEvent(PoolEventKind.NOTICE, tuple(n for j in ids for n in self.pilot(j).nodes), w,
                                    why=why))
        return events

    def _leaves(self, left: list[str], w: float) -> list[PoolEvent]:
        """The nodes of the pilots that left, in one event; those we did not cancel are cancelled if the
        scheduler still runs them (LEFT)."""
        if not left:
            return []
        gone = tuple(n for j in left for n in self.pilot(j).nodes)
        for j in left:
            p = self.pilot(j)
            p.state, p.nodes = (PilotState.GONE if p.cancelled else PilotState.LEFT), ()
        for n in gone:
            self._lane_of.pop(n, None)
        return [PoolEvent(PoolEventKind.LEAVE, gone, w)]

    def _joins(self, joined: list[tuple[str, tuple[str, ...], float | None]], pilots: dict[str, LaneBlock],
               w: float) -> list[PoolEvent]:
        """The nodes of the pilots that joined, in one event, each with when it is expected to leave."""
        if not joined:
            return []
        for j, nodes, end in joined:
            p = self.pilot(j)
            p.state, p.nodes, p.end = PilotState.RUNNING, nodes, end
            self._lane_of.update((n, pilots[j][0]) for n in nodes)
        return [PoolEvent(PoolEventKind.JOIN, tuple(n for _, nodes, _ in joined for n in nodes), w,
                          tuple(e - self._t0 if e is not None else math.inf for _, nodes, e in joined for _ in nodes))]

    def _give_back_unused(self) -> None:
        """Pilots that left us (their worker pool is gone: lost, or never to be trusted again) while the scheduler
        may still run them: cancel those it still lists, so they hold no node - a facility job may be waiting for
        it - and no allocation hours to their time limits. Tried again at the next poll when the scheduler is busy."""
        unused = sorted(j for j, p in self._book.items() if p.state is PilotState.LEFT)
        if unused and self._cancel_listed(unused, "whose worker pools are gone"):
            self._set(unused, PilotState.GONE)

    def _cancel_listed(self, ids: list[str], which: str) -> bool:
        """Cancel those of ``ids`` the scheduler still queues or runs (one survey, one scancel/qdel); False when
        the scheduler did not answer."""
        try:
            live = [j for j, st in zip(ids, self.provider.status(ids)) if not st.terminal] if ids else []
            if live:
                logger.warning("cancelling %d pilots %s: %s", len(live), which, ", ".join(live))
                self.provider.cancel(live)
            return True
        except Exception as e:           # the scheduler's queue, parsed, then one scancel/qdel
            skipped(f"pilots {which} not cancelled", e)
            return False

    def _hold(self, lane_block: LaneBlock) -> None:
        """No new tasks for this block's worker pools (``hold``): they are dead, or about to be."""
        lane, block = lane_block
        try:
            self._hold_fn(self._executors()[lane], block)
        except Exception as e:       # a pool that is already gone cannot be held; nothing is lost
            logger.debug("hold of block %s failed: %s", block, e, exc_info=True)   # Parsl's own, of any type

    # --- new pilots for the holes ---------------------------------------------------------------------------
    def _soak(self, pilots: dict[str, LaneBlock]) -> None:
        """Pilots for the holes not yet covered: holes minus nodes of pilots still queued, within max_nodes.
        Pilots on notice do not count: their replacements start while they wind down. One node a pilot, unless
        the facility caps our jobs below the holes: then holes share pilots (they all end together: at the
        earliest planned start of a waiting job). With lanes, pilots are aimed at hole nodes (``Lanes.pilots``):
        the holes not covered are those no queued pilot is aimed at."""
        waiting = [j for j in pilots if self._state(j) not in JOINED]
        size = self.provider.sizes
        joined = self._joined()
        live = sum(len(p.nodes) for p in joined.values() if p.state is PilotState.RUNNING)
        queued = jobs = 0
        aimed: set[str] = set()
        for j, st in zip(waiting, self.provider.status(waiting) if waiting else []):
            if st.terminal:
                self.pilot(j).state = PilotState.GONE
            else:
                jobs += 1
                live += size.get(j, 1)
                queued += size.get(j, 1) if st.state == JobState.PENDING else 0
                aimed.update(self.provider.targets.get(j, ()) if self.lanes else ())
        holes = [h for h in self.provider.current_holes() if h.node not in aimed]
        want = min(len(holes) - (0 if self.lanes else queued), self.max_nodes - live)
        if self.demand is not None:
            want = min(want, self.demand - live)
        if want <= 0:
            return
        pilots_n, per = want, 1
        slots = self.provider.job_slots()            # the facility's cap on our jobs in its queue
        if slots is not None:
            free = slots - jobs - len(joined)
            if free <= 0:
                return
            if free < want and self.provider.multi_node:
                per = math.ceil(want / free)
            pilots_n = min(free, math.ceil(want / per))
        pilots_n = min(pilots_n, self._submissions_left())
        if pilots_n <= 0:
            return
        if self.lanes is None:
            with self.provider.pilots(PilotShape(nodes=per)):      # Parsl's scale-out has no room for it
                self.executor.scale_out_facade(pilots_n)
            self._submitted.extend([self.clock()] * pilots_n)
        else:
            self._soak_lanes(self.lanes, pilots, holes, want, per, pilots_n)

    def _submissions_left(self) -> int:
        """Pilots that may still be submitted within the last 60 s (``max_per_minute``; unbounded without)."""
        now = self.clock()
        while self._submitted and now - self._submitted[0] >= 60.0:
            self._submitted.popleft()
        if self.max_per_minute is None:
            return 1 << 30
        return self.max_per_minute - len(self._submitted)

    def _soak_lanes(self, lanes: Lanes, pilots: dict[str, LaneBlock], holes: list[Hole], want: int, per: int,
                    pilots_n: int) -> None:
        """Pilots aimed at hole nodes, each under the executor (lane) of its group."""
        held = {lanes.group(n) for p in self._joined().values() if p.state is PilotState.RUNNING for n in p.nodes}
        busy = {lane for j, (lane, _) in pilots.items() if self._state(j) not in OVER}
        for group, nodes in lanes.pilots(holes, want, per, pilots_n, held):
            with self.provider.pilots(PilotShape(nodes=len(nodes), target=nodes)):
                lanes.executor(group, busy).scale_out_facade(1)
            self._submitted.append(self.clock())
            busy.add(group)

    # --- the orchestrator's calls ---------------------------------------------------------------------------
    def release(self, nodes: Collection[str]) -> None:
        """The orchestrator is done with these nodes on notice (what ran there has checkpointed): cancel their
        pilots now, not at the next poll nor at the pilots' time limits, so that the facility job waiting for
        them, or replacement pilots, can start on them."""
        nodes = set(nodes)
        for p in self._joined().values():     # a claimed pilot waits no longer than what ran there
            if p.state is PilotState.NOTICED and set(p.nodes) <= nodes and not p.cancelled:
                p.release_at = -math.inf
        self._cancel_due(self._pilots(), self.clock())

    def stop(self) -> None:
        """Give every node back: cancel all pilots (also those still queued)."""
        ids = list(self._pilots())
        if ids:
            self.provider.cancel(ids)
        self._set(ids, PilotState.GONE)
        self._give_back_unused()
