"""Live idle-capacity sources for the runtime: pilot jobs on a batch system, or (the embedded default) an
emulated pool on the local machine.

``EmulatedPool`` replays idle intervals (a real trace slice, or a pattern) in wall-clock time, ``speedup`` times
faster. Before every reclaim it sends a notice (``notice_s`` wall seconds ahead, as Slurm's --signal does), then
the node is gone. The orchestrator turns notices into "checkpoint now" requests and kills what still runs on a
node when it leaves.
"""
from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from parsl.jobs.states import JobState

from ..idle.intervals import IdleIntervals, read_idle_intervals
from ..topology import Topology
from .lanes import Lanes

logger = logging.getLogger(__name__)
DEMO_TRACE = Path(__file__).resolve().parent.parent / "data" / "demo_idle_intervals.csv"


@dataclass(frozen=True)
class PoolEvent:
    kind: str                 # join | notice | leave
    nodes: tuple[str, ...]
    wall: float               # seconds since the pool started
    until: tuple[float, ...] = ()   # join: wall time each node is expected to leave
    why: str = ""                   # notice: what announced it (walltime, scheduler signal, facility job)


class EmulatedPool:
    gang = False             # a fragment's ranks all run in one task on this machine
    demand: int | None = None   # the emulated nodes come and go by the trace, whatever the jobs need

    def __init__(self, intervals: IdleIntervals, *, speedup: float = 30.0, notice_s: float = 3.0,
                 repeat: bool = False, clock=time.monotonic):
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.intervals, self.speedup, self.notice_s, self.clock = intervals, speedup, notice_s, clock
        self.repeat = repeat
        self.duration = intervals.span / speedup
        self._heap: list[tuple[float, int, int, PoolEvent]] = []
        self._seq = 0
        self._cycle = 0
        self._origin: float | None = None
        self._load_cycle()

    def _push(self, w: float, order: int, ev: PoolEvent) -> None:
        heapq.heappush(self._heap, (w, order, self._seq, ev))
        self._seq += 1

    def _load_cycle(self) -> None:
        """Queue one pass of the trace; when repeating, every node still idle at its end leaves then."""
        off = self._cycle * self.duration
        t0 = self.intervals.t0
        idle: set[str] = set()
        for ev in self.intervals.events():
            w = off + (ev.time - t0) / self.speedup
            if ev.left:
                self._push(max(w - self.notice_s, off), 1, PoolEvent("notice", ev.left, w))
                self._push(w, 0, PoolEvent("leave", ev.left, w))
                idle -= set(ev.left)
            if ev.joined:
                until = tuple(off + (u - t0) / self.speedup for u in ev.joined_until)
                self._push(w, 2, PoolEvent("join", ev.joined, w, until))
                idle |= set(ev.joined)
        if self.repeat and idle:
            end = off + self.duration
            left = tuple(sorted(idle))
            self._push(max(end - self.notice_s, off), 1, PoolEvent("notice", left, end))
            self._push(end, 0, PoolEvent("leave", left, end))
        self._cycle += 1

    @classmethod
    def demo(cls, **kw) -> "EmulatedPool":
        return cls(read_idle_intervals(DEMO_TRACE), **kw)

    @classmethod
    def pattern(cls, nodes: int, period_s: float, cycles: int, **kw) -> "EmulatedPool":
        """A synthetic square wave: node i is idle for the first (i+1)/(nodes+1) of every period."""
        names = [f"node{i}" for i in range(nodes)]
        node, start, end = [], [], []
        for c in range(cycles):
            for i in range(nodes):
                node.append(i)
                start.append(c * period_s)
                end.append(c * period_s + period_s * (i + 1) / (nodes + 1))
        return cls(IdleIntervals.build(names, node, start, end, 0.0, cycles * period_s), **{"speedup": 1.0, **kw})

    def start(self) -> None:
        self._origin = self.clock()

    def elapsed(self) -> float:
        return 0.0 if self._origin is None else self.clock() - self._origin

    def poll(self) -> list[PoolEvent]:
        """Events due by now, in order (leave before join at the same instant)."""
        now = self.elapsed()
        if self.repeat and now >= (self._cycle - 1) * self.duration:
            self._load_cycle()
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[3])
        return out

    def release(self, nodes) -> None:
        """Nothing to give back early: the trace says when a node leaves."""

    def stop(self) -> None:
        """Nothing to give back: the emulated nodes are this machine."""

    @property
    def finished(self) -> bool:
        return not self.repeat and not self._heap and self.elapsed() >= self.duration


class PilotPool:
    """Live idle capacity on a batch system: pilot jobs of an HTEX executor whose provider is a PilotProvider.

    It keeps one pilot per hole (up to ``max_nodes``; several holes a pilot when the facility caps our jobs),
    launched as Parsl blocks through the executor, so Parsl's own bookkeeping (status polling, cancelling at
    shutdown) covers them. A pilot's nodes join once it runs AND each node's worker pool has connected. They get
    a notice when the scheduler signals the pilot, when its walltime ends within ``notice_s``, or when a waiting
    facility job is planned to start on them: then the pilot is cancelled ``release_s`` later (time to
    checkpoint), so the facility job does not wait for a pilot; other noticed pilots go when the orchestrator
    ``release``s their nodes. They leave when the pilot stops running or its worker pool is lost.
    HTEX decides which node runs which task, so a fragment of n ranks is n one-rank tasks (``gang``) and the
    orchestrator's books follow where the ranks landed. With the network's groups (``topology``, else what the
    provider's scheduler says) and a provider that can aim pilots, pilots go to hole nodes group by group, one
    executor per group (``lanes``): ``executor_label(node)`` is where a task meant for ``node`` goes.
    """

    gang = True
    demand: int | None = None   # set by the orchestrator: nodes its jobs could use; no pilots beyond that

    def __init__(self, executor, *, max_nodes: int = 64, probe_s: float = 5.0, poll_s: float = 1.0,
                 notice_s: float | None = None, release_s: float = 3.0, clock=time.time,
                 topology: Topology | None = None, new_executor=None):
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        self.executor, self.provider = executor, executor.provider
        learn = getattr(self.provider, "topology", None)
        self.topology = topology if topology is not None or learn is None else learn()
        self.lanes = None
        if self.topology is not None and getattr(self.provider, "can_target", False) and new_executor is not None:
            self.lanes = Lanes(executor, self.topology, new_executor)
        self._lane_of: dict[str, str] = {}     # joined node -> the group (lane) of the pilot holding it
        self.max_nodes, self.probe_s, self.poll_s, self.clock = max_nodes, probe_s, poll_s, clock
        self.notice_s = float(self.provider.notice_s if notice_s is None else notice_s)
        self.release_s = release_s
        self._t0 = clock()
        self._last_probe = self._last_poll = -math.inf
        self._nodes: dict[str, tuple[str, ...]] = {}   # job id -> its nodes, for pilots that joined
        self._noticed: set[str] = set()
        self._release: dict[str, float] = {}   # job id -> when we cancel it (a facility job wants its node)
        self._gone: set[str] = set()           # pilots that ended: never looked at again
        self._looked: set[str] = set()         # pilots whose worker pool's connection made us survey at once
        self._unused: set[str] = set()         # pilots that left us, to cancel if the scheduler still runs them
        self._recorded: set[str] = set()       # pilots written to this run's ledger

    def start(self) -> None:
        self._t0 = self.clock()
        self._cancel_orphans()

    # --- the pilot ledger: a file per run and site, beside the run's pilot scripts ---------------------------
    def _scripts(self) -> Path | None:
        """Parsl's <run_dir>/submit_scripts (runs of one state directory are its siblings), else None."""
        d = getattr(self.provider, "script_dir", None)
        return Path(d) if d and Path(d).name == "submit_scripts" else None

    def _record(self, pilots) -> None:
        """Every pilot's job id, as it is submitted: what a later run of this state directory cancels if this
        orchestrator dies before it gives its pilots back."""
        new = [j for j in pilots if j not in self._recorded]
        scripts = self._scripts()
        if new and scripts is not None:
            self._recorded.update(new)
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

    def _executors(self) -> dict[str, object]:
        return {"": self.executor} if self.lanes is None else dict(self.lanes.executors)

    def _pilots(self) -> dict[str, tuple[str, str]]:
        """job id -> (lane, block) of the pilots not known to have ended."""
        return {str(j): (lane, str(b)) for lane, ex in self._executors().items()
                for b, j in list(ex.blocks_to_job_id.items()) if str(j) not in self._gone}

    def executor_label(self, node: str) -> str | None:
        """The label of the executor whose worker pools run on ``node``'s group; None: the pool's one executor."""
        if self.lanes is None or node not in self._lane_of:
            return None
        return self.lanes.executors[self._lane_of[node]].label

    def poll(self) -> list[PoolEvent]:
        now = self.clock()
        if now - self._last_poll < self.poll_s:      # the scheduler is asked every poll_s, not every loop
            return []
        self._last_poll = now
        pilots = self._pilots()
        probe = now - self._last_probe >= self.probe_s
        if probe:
            self._last_probe = now
        claimed: set[str] = set()
        if pilots:        # every poll (the survey is taken anyway): a facility job that wants a node gets it soon
            try:
                claimed = self.provider.claimed(self.probe_s + self.release_s)
            except Exception as e:
                logger.warning("claim check skipped: %s", e)
            for jid, nodes in self._nodes.items():
                if claimed & set(nodes) and jid not in self._release:
                    self._release[jid] = now + self.release_s
        due = [j for j, t in self._release.items() if t <= now and j in pilots]
        if due:
            try:
                self.provider.cancel(due)
                for j in due:
                    self._release[j] = math.inf
            except Exception as e:                   # tried again at the next poll
                logger.warning("pilot cancel failed: %s", e)
        try:
            managers: dict[tuple[str, str], int] = {}      # (lane, block) -> worker pools connected
            for lane, ex in self._executors().items():
                for m in ex.connected_managers():
                    key = (lane, str(m.get("block_id")))
                    managers[key] = managers.get(key, 0) + 1
            started = {j for j, b in pilots.items() if b in managers and j not in self._nodes} - self._looked
            if started:     # a worker pool connected, so its pilot runs: look now, not at the next survey
                self._looked |= started
                self.provider.snapshot(max_age_s=self.poll_s)
            where = self.provider.where(list(pilots)) if pilots else {}
        except Exception as e:      # a busy scheduler or interchange: no news is not "every node left"
            logger.warning("pilot poll skipped: %s", e)
            return []
        # a pilot that has not joined yet runs nothing to checkpoint: give a claimed node back at once
        early = [j for j in pilots if j not in self._nodes and j in where and claimed & set(where[j][0])]
        if early:
            try:
                self.provider.cancel(early)
                self._gone.update(early)
                for j in early:
                    self._hold(pilots[j])
                    del pilots[j]
            except Exception as e:                   # tried again at the next probe
                logger.warning("pilot cancel failed: %s", e)
        joined, noticed, left = [], [], []
        for jid, block in pilots.items():
            nodes, end = where.get(jid, ((), None))
            if jid in self._nodes:
                if not (nodes and managers.get(block)):
                    left.append(jid)
                elif jid not in self._noticed:
                    why = ("a facility job is planned onto it" if jid in self._release else
                           "scheduler signal" if self.provider.noticed(jid) else
                           "walltime ends" if end is not None and now >= end - self.notice_s else "")
                    if why:
                        noticed.append((jid, why))
            elif nodes and managers.get(block, 0) >= len(nodes):     # every node's worker pool is there
                joined.append((jid, nodes, end))
        for jid in [j for j, _ in noticed] + left:     # no new tasks for its worker pools, dead or about to be
            self._hold(pilots[jid])
        w = now - self._t0
        events = []
        for why in sorted({why for _, why in noticed}):
            ids = [j for j, y in noticed if y == why]
            self._noticed.update(ids)
            events.append(PoolEvent("notice", tuple(n for j in ids for n in self._nodes[j]), w, why=why))
        if left:
            gone = tuple(n for j in left for n in self._nodes.pop(j))
            events.append(PoolEvent("leave", gone, w))
            self._gone.update(left)
            self._unused.update(j for j in left if self._release.get(j) != math.inf)    # not cancelled already
            for n in gone:
                self._lane_of.pop(n, None)
        self._give_back_unused()
        if joined:
            self._nodes.update((j, nodes) for j, nodes, _ in joined)
            self._lane_of.update((n, pilots[j][0]) for j, nodes, _ in joined for n in nodes)
            events.append(PoolEvent("join", tuple(n for _, nodes, _ in joined for n in nodes), w,
                                    tuple(e - self._t0 if e is not None else math.inf
                                          for _, nodes, e in joined for _ in nodes)))
        if probe:                                    # after the notices: their replacements start now
            try:
                self._soak({j: b for j, b in pilots.items() if j not in self._gone})
            except Exception as e:
                logger.warning("pilot submission skipped: %s", e)
            self._record(self._pilots())
        return events

    def _give_back_unused(self) -> None:
        """Pilots that left us (their worker pool is gone: lost, or never to be trusted again) while the scheduler
        may still run them: cancel those it still lists, so they hold no node - a facility job may be waiting for
        it - and no allocation hours to their time limits. Tried again at the next poll when the scheduler is busy."""
        if self._unused and self._cancel_listed(sorted(self._unused), "whose worker pools are gone"):
            self._unused.clear()

    def _cancel_listed(self, ids: list[str], which: str) -> bool:
        """Cancel those of ``ids`` the scheduler still queues or runs (one survey, one scancel/qdel); False when
        the scheduler did not answer."""
        try:
            live = [j for j, st in zip(ids, self.provider.status(ids)) if not st.terminal] if ids else []
            if live:
                logger.warning("cancelling %d pilots %s: %s", len(live), which, ", ".join(live))
                self.provider.cancel(live)
            return True
        except Exception as e:
            logger.warning("pilots %s not cancelled: %s", which, e)
            return False

    def _hold(self, lane_block: tuple[str, str]) -> None:
        """HTEX only learns that a worker pool died when its heartbeats stop; until then it would still send
        it tasks. Parsl's own scale-in holds blocks this way."""
        lane, block = lane_block
        try:
            self._executors()[lane]._hold_block(block)
        except Exception as e:       # a pool that is already gone cannot be held; nothing is lost
            logger.debug("hold of block %s failed: %s", block, e)

    def _soak(self, pilots: dict[str, tuple[str, str]]) -> None:
        """Pilots for the holes not yet covered: holes minus nodes of pilots still queued, within max_nodes.
        Pilots on notice do not count: their replacements start while they wind down. One node a pilot, unless
        the facility caps our jobs below the holes: then holes share pilots (they all end together: at the
        earliest planned start of a waiting job). With lanes, pilots are aimed at hole nodes (``Lanes.pilots``):
        the holes not covered are those no queued pilot is aimed at."""
        waiting = [j for j in pilots if j not in self._nodes]
        size = self.provider.sizes
        live = sum(len(n) for j, n in self._nodes.items() if j not in self._noticed)
        queued = jobs = 0
        aimed: set[str] = set()
        for j, st in zip(waiting, self.provider.status(waiting) if waiting else []):
            if st.terminal:
                self._gone.add(j)
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
            free = slots - jobs - len(self._nodes)
            if free <= 0:
                return
            if free < want and self.provider.multi_node:
                per = math.ceil(want / free)
            pilots_n = min(free, math.ceil(want / per))
        if self.lanes is None:
            self.provider.pilot_nodes = per
            self.executor.scale_out_facade(pilots_n)
            return
        held = {self.lanes.group(n) for j, nodes in self._nodes.items() if j not in self._noticed for n in nodes}
        busy = {lane for j, (lane, _) in pilots.items() if j not in self._gone}
        for group, nodes in self.lanes.pilots(holes, want, per, pilots_n, held):
            self.provider.pilot_nodes, self.provider.pilot_target = len(nodes), nodes
            try:
                self.lanes.executor(group, busy).scale_out_facade(1)
            finally:
                self.provider.pilot_target = ()
            busy.add(group)

    def release(self, nodes) -> None:
        """The orchestrator is done with these nodes on notice (what ran there has checkpointed): cancel their
        pilots at the next poll instead of holding the nodes to the pilots' time limits, so that replacement
        pilots can start on them."""
        nodes = set(nodes)
        for jid, held in self._nodes.items():
            if jid in self._noticed and set(held) <= nodes and jid not in self._release:
                self._release[jid] = -math.inf

    def stop(self) -> None:
        """Give every node back: cancel all pilots (also those still queued)."""
        ids = list(self._pilots())
        if ids:
            self.provider.cancel(ids)
        self._gone.update(ids)
        self._give_back_unused()


@dataclass
class SitePool:
    """One site of a run: its idle pool, the label of the Parsl executor that runs on it, where its checkpoints
    go (None: under the orchestrator's state directory) and how many ranks a fragment runs per node (the
    site's accelerators per node)."""

    pool: object
    executor: str
    checkpoint_dir: Path | None = None
    ranks_per_node: int = 1


class MultiPool:
    """Several sites' pools as one: node ids become ``site:node`` (what ``planner.multisite`` expects);
    the orchestrator runs each fragment through the executor of the site its nodes belong to."""

    def __init__(self, sites: dict[str, SitePool]):
        bad = [s for s in sites if not s or ":" in s]
        if bad or not sites:
            raise ValueError(f"site names must be non-empty and free of ':', got {list(sites) or 'none'}")
        self.sites = sites

    def start(self) -> None:
        for s in self.sites.values():
            s.pool.start()

    def poll(self) -> list[PoolEvent]:
        return [PoolEvent(e.kind, tuple(f"{name}:{n}" for n in e.nodes), e.wall, e.until)
                for name, s in self.sites.items() for e in s.pool.poll()]

    def release(self, nodes) -> None:
        for name, s in self.sites.items():
            s.pool.release({n.split(":", 1)[1] for n in nodes if n.startswith(f"{name}:")})

    def stop(self) -> None:
        for s in self.sites.values():
            s.pool.stop()
