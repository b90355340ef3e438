"""Fragments as the orchestrator sees them: what it launched (``Running``), the configuration it launches with,
and how an ended fragment is classified (``Outcome``) and accounted for.

A fragment ends in one of four ways. It returns its result (``ENDED``; the user's loop returning on its own is
``FINISHED``: the job is done). Or it fails: when its nodes were reclaimed (it was killed, its gang's shares were
given up or lost with their nodes, or its worker pool died with its node) that is ``RECLAIMED``, a normal event
that costs the job only the work since its last save; otherwise ``FAILED``, which counts towards the job's
crash-loop limit. Either way the job resumes from its newest good checkpoint - unless that is a newer parsl-bft's
(``REFUSED``: the job fails at once, naming the format; nothing older is resumed from). A fragment killed with its nodes
that had held them ``NO_REPORT_S`` without a single progress report of its own (its loop never reaches
``ctx.should_stop()``) is ``FAILED`` too: such a loop would otherwise be relaunched on every hole for ever.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from parsl.executors.high_throughput.errors import ManagerLost

from ..nodes import node_id
from ..train.config import FragmentConfig, FragmentResult, Precision, StopReason
from ..train.config import new_fragment_id as new_fragment_id  # the orchestrator's, minted where FragmentConfig's is
from ..train.leftovers import kill_share_processes, share_mark
from ..train.protocol import JobDir
from .events import Abandon, Event, FragmentDone, FragmentFailedEvent, Placed, StopRequest
from .htex import FragmentHandle, FragmentLost, interchange_gone
from .jobstore import JobStore
from .training_job import TrainingJob

if TYPE_CHECKING:
    from ..control import Controller
    from ..train.checkpoint import TrainingState

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 30.0      # a dead peer fails the fragment after this long, it does not hang
NO_REPORT_S = 300.0              # a killed fragment silent this long after its launch failed on its own


class FragmentRunner(Protocol):
    """How the orchestrator runs fragments at one site (``htex.SiteRunner``: Parsl apps)."""

    gang: bool       # one task per node share (pilots), whose placement is read back

    def launch(self, cfg: FragmentConfig, nodes: tuple[str, ...]) -> FragmentHandle:
        """Start a fragment on ``nodes`` (names at the site)."""

    def prime(self, nodes: list[str]) -> list[Future[str]]:
        """Nodes joined: prepare them for a first fragment. Each future answers with the node (its name at the
        site) that is ready; none: they are ready as they are."""

    def placed(self, fragment: str, nodes: int) -> dict[int, str]:
        """Node share index -> the node it landed on, for the shares that have said so."""

    def warm_up(self, barrier_dir: Path, log: Callable[[Event], None], stop: Callable[[], bool]) -> None:
        """Start workers' rank processes before the pool does (where workers stay)."""


class Outcome(StrEnum):
    """How a fragment ended."""

    ENDED = "ended"            # it saved its checkpoint and returned its result
    FINISHED = "finished"      # ... and the user's training function returned on its own: the job is done
    RECLAIMED = "reclaimed"    # it died because its nodes were reclaimed: not the job's own failure
    FAILED = "failed"          # it failed on its own
    REFUSED = "refused"        # its job's newest checkpoint is a newer parsl-bft's: no retry can read it


@dataclass
class Running:
    """A launched fragment and what the orchestrator knows of it."""

    handle: FragmentHandle
    nodes: int
    fragment: str
    site: str
    launched: float                # unix time
    resume_step: int               # the newest checkpoint when it was launched (what it restores)
    interval_s: float              # its periodic checkpoint interval
    stop_requested: bool = False
    stop_at: float | None = None   # unix time the stop was requested
    killed: bool = False           # we killed it (its node was reclaimed): a normal event, not a failure
    placed: set[str] = field(default_factory=set)
    doomed: set[str] = field(default_factory=set)    # its nodes the facility is taking back
    gone: set[str] = field(default_factory=set)      # nodes that left while it ran (and did not come back)
    freeze: int = 0                # layers it has frozen

    def lost(self, gang: bool) -> bool:
        """A gang whose every started share ran on nodes that have left (their pilots ended or their worker
        pools are gone), the others given up: its ranks are dead or fenced off (``JobDir.run_fragment``), so it
        is collected now instead of when the executor notices (HTEX: a heartbeat threshold later)."""
        return (gang and bool(self.placed) and self.placed <= self.gone
                and len(self.placed) + len(self.handle.abandoned) >= self.nodes)


@dataclass
class Collected:
    """An ended fragment, classified: its result, or its error and where its job's checkpoints stand."""

    outcome: Outcome
    samples_done: int
    checkpoint: str | None
    result: FragmentResult | None = None
    error: str = ""
    stands: TrainingState | None = None      # the newest stored checkpoint's attributes (failures only)
    permanent: bool = False                  # its job's code cannot load (a WorkloadError): trying again cannot help
    ended: float = 0.0                       # unix time it was collected


class Fragments:
    """The fragments running now, one per job, and the orchestrator's handles on them through their job
    directories: fence, stop request, giving up waiting shares, kill. ``generation`` names this orchestrator's
    life (a fragment of another life must not save)."""

    def __init__(self, db: JobStore, job_dir: Callable[[str], Path], clock: Callable[[], float] = time.time):
        self.db, self.job_dir, self.clock = db, job_dir, clock
        self.running: dict[str, Running] = {}
        self.generation = uuid.uuid4().hex[:12]

    def fence(self, name: str) -> None:
        """Before (re)starting a job: fence off saves of a dead orchestrator's fragments, kill their ranks."""
        jd = JobDir(self.job_dir(name))
        jd.own(self.generation)
        jd.kill_ranks()
        jd.clear_stop()

    def request_stop(self, name: str, why: str) -> None:
        """Ask the job's running fragment to checkpoint and stop (once); but at shutdown, it may hand over its
        newest periodic checkpoint when redoing the steps since costs less than a save (``saver.hand_over``)."""
        r = self.running.get(name)
        if r and not r.stop_requested:
            r.stop_requested, r.stop_at = True, self.clock()
            JobDir(self.job_dir(name)).request_stop(hand_over=why != "shutdown")
            self.db.record(StopRequest(name, why))

    def abandon_waiting(self, name: str, all_or_none: bool) -> None:
        """Shares of a gang still waiting for a worker when their nodes are reclaimed: give them up instead of
        waiting for a new pilot in their group (FragmentHandle.abandon). On notice only if no share has started
        (a started share would wait for its given-up peers until its rendezvous times out); once nodes are
        gone, every share that has not started."""
        r = self.running[name]
        n = r.handle.abandon(all_or_none)
        if n:
            r.killed = True        # not the job's own failure
            self.db.record(Abandon(name, r.fragment, n))

    def follow_placement(self, ctl: Controller, runners: Mapping[str, FragmentRunner]) -> set[str]:
        """A gang's shares say which node they landed on: the books (who is hit by a reclaim) follow. Returns
        the nodes a share landed on that the plan does not have yet (a joined node still warming up, whose idle
        worker took a task meant for another node): once they are in the plan, the books follow."""
        outside: set[str] = set()
        for name, r in self.running.items():
            runner = runners[r.site]
            if not runner.gang or len(r.placed) == r.nodes or name not in ctl.active:
                continue
            for node in runner.placed(r.fragment, r.nodes).values():
                node = node_id(r.site, node)
                if node not in r.placed:
                    ctl.bind(name, node, r.placed)
                    if node in ctl.active[name].state.nodes:
                        r.placed.add(node)
                    elif node not in ctl.pool:
                        outside.add(node)
            if len(r.placed) == r.nodes:     # where its ranks run (the plan's nodes, or swapped within a group)
                self.db.record(Placed(name, r.fragment, sorted(r.placed)))
        return outside

    def unreachable(self, labels: Mapping[str, str]) -> bool:
        """Whether no running fragment can end the ordinary way any more: every one's executor (``labels``: site
        -> executor label) has lost its interchange, so no result of theirs will arrive, and no rank of theirs
        still runs on this host (those asked to stop have saved and left; ranks on pilots end with their pilot)."""
        return bool(self.running) and all(
            interchange_gone(labels[r.site]) and not JobDir(self.job_dir(n)).live_ranks(r.fragment)
            for n, r in self.running.items())

    def kill(self, name: str) -> None:
        """The node is gone: whatever did not stop in the notice period dies now (ranks on other hosts end
        with their pilot)."""
        r = self.running[name]
        r.killed = True
        JobDir(self.job_dir(name)).kill_ranks(r.fragment)


def fragment_config(job: TrainingJob, jd: JobDir, *, fragment: str, world_size: int, ranks_per_node: int,
                    generation: str, interval_s: float, freeze_layers: int) -> FragmentConfig:
    """What a fragment of ``job`` is launched with: train towards the job's budget from its newest checkpoint,
    saving every ``interval_s``, fenced by ``generation`` and ``fragment``."""
    return FragmentConfig(
        job=job.name, workload=job.workload, checkpoint_dir=str(jd.path), world_size=world_size,
        global_batch=job.global_batch, total_samples=job.samples, workload_args=job.workload_args,
        generation=generation, timeout_s=COLLECTIVE_TIMEOUT_S, checkpoint_every_s=interval_s, fragment_id=fragment,
        ranks_per_node=ranks_per_node, loop=job.loop, deterministic=job.deterministic, freeze_layers=freeze_layers,
        precision=Precision(job.precision), compile="inductor" if job.compile is True else job.compile or None,
        channels_last=job.channels_last, micro_batch=job.micro_batch, sync_batchnorm=job.batch_norm == "sync",
        keep_best=job.keep_best)


def newest_step(d: Path) -> int:
    """The step of the newest checkpoint in a job directory (0: none)."""
    # torch, imported when a job needs it: a re-run of a finished workflow imports none
    from ..train.checkpoint import CheckpointStore
    return CheckpointStore(d).newest_step()


def collect(r: Running, jd: JobDir, *, lost: bool, job_samples: int, now: float) -> Collected:
    """Classify an ended fragment (``r.handle.done()``, or ``lost``: every node it ran on has left), collected
    at unix time ``now``. What its ranks started on this host and still runs (its launcher died before it could
    end them) is killed."""
    from ..train.checkpoint import NewerFormatError

    kill_share_processes(share_mark(r.fragment, 0))
    try:
        if lost:
            r.killed = True         # reclaimed: not the job's own failure
            raise FragmentLost(f"fragment {r.fragment}: every node it ran on has left "
                               f"({', '.join(sorted(r.placed))}); its ranks are gone or fenced off")
        res = r.handle.result()
    except Exception as e:   # a killed or failed fragment: resume from the last good checkpoint
        # of any type (the job's own code raised it); where it is ours, its traceback is in the log
        logger.debug("fragment %s ended with %s", r.fragment, type(e).__name__, exc_info=True)
        r.killed |= isinstance(e, ManagerLost)     # its node's worker pool died with the node
        try:
            st, done, ckpt = where_it_stands(jd, job_samples)
        except NewerFormatError as refused:
            return Collected(Outcome.REFUSED, 0, None, error=str(refused), ended=now)
        error = first_error(jd, r.fragment) or str(e)
        silent = r.killed and never_reported(r, jd, now)
        if silent:
            error = (f"fragment {r.fragment} held its nodes {now - r.launched:.0f} s without one progress report "
                     "(its loop never reached ctx.should_stop()), then was killed with them: counted as the job's "
                     f"own failure\n{error}")
        permanent = any(e.kind == "WorkloadError" for e in jd.errors(r.fragment)[:1])
        return Collected(Outcome.RECLAIMED if r.killed and not silent else Outcome.FAILED, done, ckpt,
                         error=error, stands=st, ended=now, permanent=permanent)
    outcome = Outcome.FINISHED if res.stopped_by is StopReason.FINISHED else Outcome.ENDED
    return Collected(outcome, res.samples_done, res.checkpoint, result=res, ended=now)


def never_reported(r: Running, jd: JobDir, now: float) -> bool:
    """The fragment held its nodes ``NO_REPORT_S`` or longer and wrote no progress report in its life."""
    p = jd.progress()
    return now - r.launched >= NO_REPORT_S and not (p is not None and p.t >= r.launched)


def first_error(jd: JobDir, fragment: str) -> str:
    """The first failing rank's exception and traceback, with where its output is ("" if no rank recorded one)."""
    errors = jd.errors(fragment)
    if not errors:
        return ""
    return f"{errors[0].summary()}\n(rank {errors[0].rank}'s output: {jd.log_path(fragment, errors[0].rank)})"


def where_it_stands(jd: JobDir, job_samples: int) -> tuple[TrainingState | None, int, str | None]:
    """The newest good checkpoint's attributes, samples done and path. Attributes, not gigabytes, unless it
    completes the job: a result is handed out verified."""
    from ..train.checkpoint import CheckpointStore

    store = CheckpointStore(jd.path)
    st = store.latest(arrays=False)
    if st is not None and st.samples_done >= job_samples:
        st = store.latest()
    return (st, st.samples_done, str(store.latest_path)) if st else (None, 0, None)


def failure_event(job: str, r: Running, c: Collected, jd: JobDir) -> FragmentFailedEvent:
    """The event log's record of a fragment that ended without a result: with the steps and seconds of
    training since its last save when its own progress report says (a report of this fragment's life)."""
    p = jd.progress()
    fresh = p is not None and p.t >= r.launched and p.step >= r.resume_step
    return FragmentFailedEvent(
        job, r.fragment, c.error[-4000:], reclaimed=c.outcome is Outcome.RECLAIMED,
        without_notice=not r.stop_requested, resume_step=r.resume_step, saved_step=c.stands.step if c.stands else 0,
        checkpoint_every_s=round(r.interval_s, 2),
        lost_steps=p.step - p.saved_step if fresh and p else None,
        lost_s=round(p.t - p.saved_at, 3) if fresh and p else None, launched=r.launched, ended=c.ended)


def done_event(job: str, r: Running, c: Collected) -> FragmentDone:
    """The event log's record of a fragment that ended with its result (``c.result``)."""
    res = c.result
    assert res is not None
    return FragmentDone(job, r.fragment, r.nodes, res.world_size, r.launched, res.train_started, res.train_s,
                        res.start_step, res.end_step, res.stopped_by, res.periodic_saves, res.checkpoint_s,
                        samples=res.samples, ended=c.ended, restore_s=round(res.restore_s, 3),
                        rendezvous_s=round(res.rendezvous_s, 3))
