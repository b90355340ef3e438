"""The scheduler-independent part of a pilot-job provider: Parsl blocks that are pilots soaking up holes.

Subclasses (one sub-package per scheduler) set ``self.cmd`` (their command seam, with ``submit(script)`` and
``cancel(ids)``) and supply the hooks: survey the scheduler, look up ended jobs, write the batch script. This
base sizes pilots to the current hole, withdraws pilots that do not start promptly (a queued pilot competes
with the facility's jobs) and reports every normal end of an idle window - reclaimed, preempted, out of its
hole - as TIMEOUT or SCALED_IN, never FAILED (Parsl marks an executor broken when all its blocks fail).

Two threads call a provider: the orchestrator's loop (through the pilot pool) and Parsl's JobStatusPoller
(``status``, every ``poll_s``). The survey and the book-keeping (pilots submitted, their sizes and targets,
those withdrawn, final states, refusals) are therefore behind one lock (``_lock``) that every public method
holds. A pilot's shape (``PilotShape``: its nodes, and those it is aimed at) is an argument down to the batch
script; only at Parsl's ``scale_out_facade``, whose ``submit(command, tasks_per_node, job_name)`` has no room
for it, does it travel beside the call: ``with provider.pilots(shape): executor.scale_out_facade(n)`` holds
the lock across, so no other thread's submission can see (or change) it.
"""
from __future__ import annotations

import logging
import math
import os
import re
import shlex
import subprocess
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import wraps
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from parsl.jobs.states import JobState, JobStatus
from parsl.launchers import SingleNodeLauncher
from parsl.providers.cluster_provider import ClusterProvider

from ..errors import BadValue, ParslBftError
from ..topology import Topology, TopologyError
from .claims import claimed
from .commands import BatchCommands, SchedulerError

logger = logging.getLogger(__name__)
SURVEY_SLACK_S = 0.25   # a survey this much short of its max age is due anyway (clock reads a poll apart)

_JUST_SUBMITTED = ""


def node_name(node: str) -> str:
    """A node name from the scheduler, pasted into a batch directive (an aimed pilot): one plain token."""
    if not re.fullmatch(r"[\w.-]+", node):
        raise ValueError(f"cannot aim a pilot at node {node!r}: not a plain host name")
    return node


class PilotsRefused(ParslBftError):
    """The scheduler refused the site's pilots again and again with the same words (a missing or wrong account,
    partition, QOS, an option it cannot satisfy): the run stops with those words instead of retrying forever."""


@dataclass(frozen=True)
class Hole:
    """An idle node and how long it stays idle."""

    node: str
    until: float          # unix time the node is expected to be taken back (inf: no queued job needs it)


@dataclass(frozen=True)
class QueueJob:
    """One job the scheduler holds, anyone's."""

    job_id: str
    state: str                      # the scheduler's own word: PENDING / RUNNING / ... (Slurm), Q / R / ... (PBS)
    reason: str = ""
    start: float | None = None      # waiting: when the scheduler plans to start it; running: when it started
    end: float | None = None        # running: when its time limit ends
    nodes: tuple[str, ...] = ()     # running: where it runs; waiting: where the scheduler plans to run it
    size: int = 0                   # nodes it asks for (0: not said; then len(nodes))
    limit_s: float | None = None    # its time limit (walltime), where the scheduler says


@dataclass(frozen=True)
class Snapshot:
    """What the scheduler said in one survey (2 queries, plus reservations now and then): hole discovery,
    claims, pilot placement and pilot states - the pool's and Parsl's status poller's - are all read from it."""

    taken: float                              # unix time of the survey
    idle: tuple[str, ...]                     # usable idle nodes of the pilots' partition / queue
    jobs: Mapping[str, QueueJob]              # every job the scheduler holds, by id
    reserved: Mapping[str, float] = field(default_factory=dict)   # node -> start of a reservation not begun
    waiting_states: frozenset[str] = frozenset({"PENDING"})
    running_states: frozenset[str] = frozenset({"RUNNING", "CONFIGURING", "COMPLETING"})
    waits_for_nodes: frozenset[str] = frozenset({"Resources", "Priority"})   # reasons: nodes are all it lacks
    not_judged: frozenset[str] = frozenset({"None"})  # reasons: no scheduler pass since it was submitted or freed
    fresh: frozenset[str] = frozenset()       # idle now, not at the survey before: the scheduler's pass may come

    def waiting(self) -> list[QueueJob]:
        """The jobs waiting in the queue (anyone's)."""
        return [j for j in self.jobs.values() if j.state in self.waiting_states]

    def holes(self, mine: Collection[str] = ()) -> list[Hole]:
        """Idle nodes, held until the earliest planned start of a waiting job that is not one of ours
        (conservative: all idle nodes are assumed needed then) or the start of a reservation on the node.
        When a job ends early, the one planned behind it on its nodes starts at the scheduler's next pass,
        whatever start it had planned, and pilots sent there only queue behind it. So no hole is a node that
        the queue shows a job running on (the nodes and the queue are two queries: the job started between
        them), nor one of a waiting job that lacks only nodes and is planned onto idle ones (not started yet), if
        it is the first job planned onto each of them: a job planned later, behind one planned there first, does
        not start now (a replay's idle node had no pilot for 143 s so). Nor, for one survey, is a node just freed
        (``fresh``) while a job that lacks only nodes, or that no pass has judged yet (a reservation that held it
        has just ended), would fit in the idle ones: the scheduler may start it there at its next pass, though its
        plan, made before they were freed, names others (a replay sent 4 pilots)."""
        waiting = [j for j in self.waiting() if j.job_id not in mine]
        until = min((j.start for j in waiting if j.start is not None), default=math.inf)
        idle = set(self.idle)
        first_on: dict[str, QueueJob] = {}
        for j in sorted((j for j in waiting if j.start is not None), key=lambda j: j.start or 0.0):
            for n in j.nodes:
                first_on.setdefault(n, j)
        lacks_nodes = [j for j in waiting if j.reason in self.waits_for_nodes]
        taken = {n for j in self.jobs.values() if j.state in self.running_states for n in j.nodes}
        taken |= {n for j in lacks_nodes if j.nodes and set(j.nodes) <= idle
                  and all(first_on.get(m) is j for m in j.nodes) for n in j.nodes}
        if any((j.size or len(j.nodes) or 1) <= len(idle) for j in waiting
               if j.reason in self.waits_for_nodes or j.reason in self.not_judged):
            taken |= self.fresh
        return [Hole(n, min(until, self.reserved.get(n, math.inf))) for n in self.idle if n not in taken]


@dataclass(frozen=True, kw_only=True)
class PilotShape:
    """One pilot's size, and the idle nodes it is aimed at (empty: wherever the scheduler puts it)."""

    nodes: int = 1
    target: tuple[str, ...] = ()


_F = TypeVar("_F", bound=Callable[..., Any])


def locked(method: _F) -> _F:
    """A provider method that holds the provider's lock (the module's docstring says why)."""
    @wraps(method)
    def under_lock(self: PilotProvider, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return cast(_F, under_lock)


def _hhmmss(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


class PilotProvider(ClusterProvider):
    """Parsl provider whose blocks are pilots. Scheduler load is fixed per poll cycle, whatever the number of
    pilots: one survey (``snapshot``) every ``poll_s`` seconds serves everything; besides it, one ``ended`` query
    per pilot that left the scheduler's memory, one sbatch/qsub per pilot, one walltime check per scale-out and
    one cancel per batch of pilots given back.

    Parameters (every back end takes these, besides its own)
    ----------
    walltime_min_min, walltime_max_min : int
        The shortest and longest walltime a pilot asks for, in minutes (``1 <= min <= max``); within them a
        pilot asks for the length of the hole it is sent to.
    notice_s : int
        Seconds of reclaim notice: the scheduler signals a pilot this long before its walltime ends.
    max_pending_s : float
        A pilot still queued after this many seconds is withdrawn (a queued pilot competes with the facility's
        jobs; the hole it was meant for has gone).
    worker_init : str
        Shell lines a pilot runs before its worker pool starts (activate the environment).
    script_dir : str
        Where pilot scripts, their output and notice marks go (Parsl sets it to the run's submit_scripts).
    nodes_per_block : int
        Nodes of a pilot, unless the pool packs holes into bigger pilots when the facility caps our jobs.
    poll_s : int
        Seconds between scheduler surveys (and Parsl's status polls of these blocks).
    scheduler_options : list of str
        Extra batch directives, one option each (without the #SBATCH / #PBS prefix).
    max_jobs : int or None
        The site's cap on our jobs in the queue, where the scheduler cannot be asked for it.
    """

    STATES: ClassVar[dict[str, JobState]] = {}
    multi_node: ClassVar[bool] = False   # can one pilot start a worker pool on each of several nodes (on_each_node)?
    can_target: ClassVar[bool] = False   # can a pilot be aimed at given idle nodes (``pilot_target``)?
    REFUSALS_IN_A_ROW: ClassVar[int] = 3  # the same refusal this often: the site file is wrong, stop submitting
    cmd: BatchCommands

    def __init__(self, label: str, *, walltime_min_min: int = 1, walltime_max_min: int = 30, notice_s: int = 60,
                 max_pending_s: float = 30.0, worker_init: str = "", script_dir: str = "bft-pilots",
                 nodes_per_block: int = 1, poll_s: int = 5, scheduler_options: list[str] | None = None,
                 max_jobs: int | None = None):
        _check_arguments(walltime_min_min, walltime_max_min, notice_s, max_pending_s, nodes_per_block, poll_s,
                         max_jobs)
        # Parsl's block bookkeeping: blocks are only ever started by the pool (scale_out), never by a strategy;
        # the launcher is unused: a pilot script starts its worker pools itself (``on_each_node``)
        super().__init__(label, nodes_per_block, 0, 0, 1_000_000, 1,   # type: ignore[no-untyped-call]
                         _hhmmss(walltime_max_min), SingleNodeLauncher(), cmd_timeout=30)
        self.walltime_min_min, self.walltime_max_min, self.notice_s = walltime_min_min, walltime_max_min, notice_s
        self.max_pending_s, self.worker_init = max_pending_s, worker_init
        # absolute: pilot scripts run in whatever directory the scheduler starts them in
        self.script_dir = str(Path(script_dir).resolve())
        self._lock = threading.RLock()         # the survey and the book-keeping below (the module's docstring)
        self._next: PilotShape | None = None   # the shape of the pilots ``pilots()`` submits
        self.targets: dict[str, tuple[str, ...]] = {}   # job id -> the nodes it was aimed at
        self._topology: tuple[Topology | None] | None = None
        self.sizes: dict[str, int] = {}        # job id -> nodes
        self.scheduler_options = list(scheduler_options or [])
        self.poll_s = poll_s
        self.clock: Callable[[], float] = time.time
        self._snapshot: Snapshot | None = None
        self.max_jobs = max_jobs               # the site file's cap on our queued jobs, if it states one
        self._job_limit: tuple[int | None] | None = None
        self._ended: dict[str, tuple[str, str]] = {}    # final states: asked of the scheduler once per pilot
        self.submitted: dict[str, float] = {}
        self.withdrawn: set[str] = set()
        self._unknown_states: set[str] = set()
        self.resources: dict[object, Any] = {}
        self.cores_per_node: int | None = None
        self.mem_per_node: float | None = None
        self._refusals: list[str] = []
        self.refused: PilotsRefused | None = None
        self._yielded: dict[str, set[str]] = {}   # a waiting facility job -> the pilots given back to it (claims)

    # --- hooks ------------------------------------------------------------------------------------------
    @abstractmethod
    def survey(self) -> Snapshot:
        """Ask the scheduler for its idle nodes and its whole queue (a fixed number of commands)."""

    @abstractmethod
    def ended(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        """Final (state, reason) of jobs the scheduler no longer lists in its queue."""

    @abstractmethod
    def script(self, command: str, job_name: str, minutes: int, shape: PilotShape | None = None) -> str:
        """The batch script of a pilot of ``shape`` (default: ``default_shape``): ``command`` started on each of
        its nodes, ``minutes`` long."""

    def default_shape(self) -> PilotShape:
        """A pilot of ``nodes_per_block`` nodes, not aimed (what a submission outside ``pilots()`` gets)."""
        return PilotShape(nodes=self.nodes_per_block)

    @contextmanager
    def pilots(self, shape: PilotShape) -> Iterator[None]:
        """The pilots submitted within the block have this shape (PilotPool packs holes into bigger pilots when
        jobs are capped, and aims pilots at a group's nodes). Parsl's ``scale_out_facade`` calls ``submit`` with
        no room for it, so the lock is held across: no other thread submits meanwhile."""
        with self._lock:
            self._next = shape
            try:
                yield
            finally:
                self._next = None

    def job_limit(self) -> int | None:
        """The facility's cap on this user's jobs in the queue; None: none known."""
        return None

    def read_topology(self) -> Topology | None:
        """Ask the scheduler for the network's groups; None where it does not know them."""
        return None

    def preflight(self) -> str:
        """Ask the scheduler, before any pilot, whether it would take this site's pilots at all (a partition or
        queue it does not have, a job it refuses); a ``SiteError`` naming the site field and the scheduler's words
        if not, else one line of what it said."""
        return "no check for this scheduler"

    @locked
    def topology(self) -> Topology | None:
        """The network's groups as the scheduler knows them, asked once (they change only when the admins
        reconfigure the machine); None where unknown or when the query fails (logged: the pilots then go
        wherever the scheduler puts them)."""
        if self._topology is None:
            try:
                self._topology = (self.read_topology(),)
            except (SchedulerError, TopologyError, OSError, subprocess.SubprocessError) as e:
                logger.warning("no network topology: %s", e)
                self._topology = (None,)
        return self._topology[0]

    def on_each_node(self, command: str, nodes: int) -> str:
        """The command that starts ``command`` once on each of the pilot's ``nodes`` nodes."""
        if nodes != 1:
            raise NotImplementedError(f"{type(self).__name__} runs one-node pilots only")
        return command

    # --- one survey per poll cycle ------------------------------------------------------------------------
    @property
    def status_polling_interval(self) -> int:
        """Seconds between Parsl's status polls: ``poll_s``, not Parsl's 60 (holes last minutes)."""
        return self.poll_s

    def _status(self) -> None:
        """Unused: ``status`` reads the survey (Parsl's ClusterProvider.status would call this)."""

    @locked
    def snapshot(self, max_age_s: float | None = None) -> Snapshot:
        """The latest survey, taken anew only when older than ``max_age_s`` (default: ``poll_s``), give or take
        ``SURVEY_SLACK_S``: a pool polling every ``poll_s`` reads its clock a little before the survey that the
        last poll took, and without the slack would find every other survey not yet due (a facility job
        seen two polls late)."""
        age = self.poll_s if max_age_s is None else max_age_s
        now = self.clock()
        if self._snapshot is None or now - self._snapshot.taken >= age - SURVEY_SLACK_S:
            last, self._snapshot = self._snapshot, self.survey()
            if last is not None:
                self._snapshot = replace(self._snapshot, fresh=frozenset(self._snapshot.idle) - set(last.idle))
        return self._snapshot

    @locked
    def job_slots(self) -> int | None:
        """How many jobs we may have in the queue: the scheduler's ``job_limit()`` (asked once) or the site
        file's ``max_jobs``, the smaller; None: no cap."""
        if self._job_limit is None:
            caps = [c for c in (self.job_limit(), self.max_jobs) if c is not None]
            self._job_limit = (min(caps) if caps else None,)
        return self._job_limit[0]

    @locked
    def current_holes(self) -> list[Hole]:
        """The holes of the latest survey (our own pilots' planned starts do not end them) that are at least as
        long as the shortest pilot: a pilot in a shorter hole would outlast it and hold back the facility job
        planned to start at its end (or be preempted for it) while training next to nothing."""
        shortest = self.clock() + self.walltime_min_min * 60
        return [h for h in self.snapshot().holes(self.submitted) if h.until >= shortest]

    @locked
    def waiting(self) -> list[QueueJob]:
        """The scheduler's waiting jobs (anyone's)."""
        return self.snapshot().waiting()

    @locked
    def where(self, job_ids: list[str]) -> dict[str, tuple[tuple[str, ...], float | None]]:
        """job id -> (its nodes, unix time its walltime ends) for the pilots that run now. A state this provider
        does not know (a newer scheduler's) counts as running where the job holds nodes: taking a live pilot
        for gone would kill its ranks."""
        jobs = self.snapshot().jobs
        out = {}
        for j in job_ids:
            job = jobs.get(j)
            if job is None or not job.nodes:
                continue
            state = self.STATES.get(job.state)
            if state is None and job.state not in self._unknown_states:
                self._unknown_states.add(job.state)
                logger.warning("pilot %s is in state %r, unknown to %s: taken as running on %s", j, job.state,
                               type(self).__name__, ",".join(job.nodes))
            if state in (None, JobState.RUNNING):
                out[j] = (job.nodes, job.end)
        return out

    def _states(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        snap = self.snapshot()
        seen = {j: (snap.jobs[j].state, snap.jobs[j].reason) for j in job_ids if j in snap.jobs}
        # submitted after the survey: the scheduler has it queued
        seen.update({j: (_JUST_SUBMITTED, "submitted after the last survey") for j in job_ids
                     if j not in seen and self.submitted.get(j, 0) >= snap.taken})
        gone = [j for j in job_ids if j not in seen and j not in self._ended]
        if gone:
            self._ended.update(self.ended(gone))
        seen.update({j: self._ended[j] for j in job_ids if j not in seen and j in self._ended})
        return seen

    @locked
    def walltime_minutes(self, now: float | None = None, shape: PilotShape | None = None) -> int:
        """A pilot's walltime: the current hole's length in whole minutes, within the configured bounds (``shape``:
        the pilot's, where the scheduler is asked whether it would start now)."""
        now = self.clock() if now is None else now
        left = min((h.until for h in self.current_holes()), default=math.inf) - now
        minutes = self.walltime_max_min if math.isinf(left) else int(left // 60)
        return max(self.walltime_min_min, min(self.walltime_max_min, minutes))

    @property
    def _dir(self) -> Path:
        return Path(self.script_dir or ".")

    def directive_path(self, path: str) -> str:
        """A path in a #SBATCH / #PBS directive: double-quoted unless it is plainly safe (no control characters
        or double quotes can reach here: the site file and the state directory are checked)."""
        if any(c in path for c in '"\n\r\0'):
            raise ValueError(f"cannot use {path!r} in a batch script (quotes or control characters)")
        return path if re.fullmatch(r"[\w./@%+,:=-]+", path) else f'"{path}"'

    # A pilot ended by its scheduler (TERM, then KILL) leaves its worker pool's multiprocessing resource tracker to
    # unlink the pool's semaphores, which it does, with a warning that was in every pilot's output: not ours to see
    QUIET_TRACKER = 'export PYTHONWARNINGS="ignore:resource_tracker:UserWarning${PYTHONWARNINGS:+,$PYTHONWARNINGS}"'

    # Is a process of this group still running? Ended ones the kernel keeps until their parent collects them
    # (zombies) do not count: the rank server, orphaned when the pool ends first, is collected by the node's init,
    # which takes up to 2 s in a container (`kill -0` on the group counted it: every pilot ended that much late)
    GROUP_ALIVE = ("group_alive() { if command -v ps > /dev/null; then ps -e -o pgid=,stat= | awk -v g=\"$1\" "
                   "'$1 == g && $2 !~ /^Z/ {f = 1} END {exit !f}'; else kill -0 -- -\"$1\" 2>/dev/null; fi; }")

    def notice_trap(self, job_id_var: str, grace_s: int = 3) -> list[str]:
        """Shell lines: run the worker in its own process group; the walltime notice (USR1) only marks the pilot
        (a mark of its own: the orchestrator has the fragment checkpoint; the worker keeps serving until then);
        TERM - the scheduler ending the job - is passed on, so ranks still save what they can, and once the group
        has ended, or ``grace_s`` seconds later (the scheduler's grace: Slurm's GraceTime), the whole group is
        killed: nothing may outlive its pilot (on sites without cgroups a process that left the job's process tree
        would). USR2 is the pool giving the pilot back: the group is ended the same way and the script exits 0,
        so the scheduler's accounting says COMPLETED, not CANCELLED. Running into the end of a hole is a pilot's
        normal end."""
        mark = '"$BFT_MARK"'                       # the path is quoted once, here (spaces, quotes, $ in it)
        # looked at 5 times a second: a facility job waiting for the node starts as soon as the group is gone
        end = (f"kill -TERM -- -$CHILD 2>/dev/null; for _ in $(seq {5 * int(grace_s)}); do group_alive $CHILD "
               "|| break; sleep 0.2; done; kill -KILL -- -$CHILD 2>/dev/null")
        return [self.GROUP_ALIVE, f"BFT_MARK={shlex.quote(str(self.script_dir))}/\"${job_id_var}\".noticed",
                f"trap 'touch {mark[:-1]}.walltime\"' USR1",
                f"trap 'touch {mark}; {end}' TERM",
                f"trap '{end}; exit 0' USR2",
                "CHILD=$!", "wait $CHILD; rc=$?",
                "while kill -0 $CHILD 2>/dev/null; do wait $CHILD; rc=$?; done",
                f"[ -e {mark} ] && exit 0", "exit $rc"]

    @locked
    def claimed(self, within_s: float, now: float | None = None) -> set[str]:
        """Nodes of our running pilots that a waiting facility job needs back (``claims.claimed``): give them
        back now."""
        return claimed(self.snapshot(), self.submitted, self._yielded, within_s,
                       self.clock() if now is None else now, self.poll_s)

    def noticed(self, job_id: str) -> bool:
        """Has the scheduler begun ending this pilot (SIGTERM: preempted, cancelled)?"""
        return (self._dir / f"{job_id}.noticed").exists()

    def walltime_signalled(self, job_id: str) -> bool:
        """Has the scheduler sent this pilot its walltime notice (``--signal``)? Slurm sends it up to 60 s
        early, so it is only worth reading for a pilot whose walltime end is not known."""
        return (self._dir / f"{job_id}.noticed.walltime").exists()

    def _refusal(self, e: SchedulerError) -> None:
        """Count a submission the scheduler refused; ``REFUSALS_IN_A_ROW`` with the same words make the provider
        ``refused`` (no more submissions: a site file the scheduler will not take is not retried forever)."""
        words = " ".join((e.err or str(e)).split())[:300]
        self._refusals = [*self._refusals, words][-self.REFUSALS_IN_A_ROW:]
        logger.warning("the scheduler refused a pilot: %s", words)
        if len(self._refusals) == self.REFUSALS_IN_A_ROW and len(set(self._refusals)) == 1:
            self.refused = PilotsRefused(
                f"the scheduler refused {self.REFUSALS_IN_A_ROW} pilots in a row: {words} (check the site file's "
                "account, partition or queue, QOS and scheduler_options; `parsl-bft sites show --pilot-script "
                "SITE.yaml` prints the script that was submitted)")

    # --- Parsl's provider interface ---------------------------------------------------------------------------
    @locked
    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.bft") -> str:
        """Write the next pilot's script (owner-only: shared file systems) and submit it; its job id. Its shape:
        that of the ``pilots()`` block it is submitted in, else ``default_shape()``."""
        if self.refused is not None:          # the same refusal again and again: ask no more
            raise self.refused
        shape = self._next or self.default_shape()
        d = self._dir
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = d / f"{job_name}.{time.monotonic_ns()}.sh"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.script(command, job_name, self.walltime_minutes(shape=shape), shape))
        os.chmod(path, 0o700)
        try:
            job_id = self.cmd.submit(str(path))
        except SchedulerError as e:
            self._refusal(e)
            raise
        self._refusals = []
        self.submitted[job_id] = self.clock()
        self.sizes[job_id] = shape.nodes
        if shape.target:
            self.targets[job_id] = shape.target
        return job_id

    @locked
    def status(self, job_ids: Sequence[object]) -> list[JobStatus]:
        """The pilots' states from the survey (ended ones asked once); pilots queued longer than
        ``max_pending_s`` are withdrawn (SCALED_IN), one that ended at its notice is TIMEOUT."""
        ids = [str(j) for j in job_ids]
        seen = self._states(ids)
        now = self.clock()
        stale = [j for j in ids if j in seen and self._state(seen[j][0]) == JobState.PENDING
                 and now - self.submitted.get(j, now) > self.max_pending_s]
        if stale:
            self.cmd.cancel(stale)
            self.withdrawn.update(stale)
        out = []
        for j in ids:
            if j in self.withdrawn:
                out.append(JobStatus(JobState.SCALED_IN, "withdrawn: did not start within the hole"))
            elif j in seen:
                raw, reason = seen[j]
                state = self._state(raw)
                if state == JobState.COMPLETED and self.noticed(j):
                    state = JobState.TIMEOUT          # it ended at its notice: the hole closed
                out.append(JobStatus(state, reason))
            else:
                out.append(JobStatus(JobState.MISSING, "not known to the scheduler"))
        return out

    def _state(self, raw: str) -> JobState:
        return JobState.PENDING if raw == _JUST_SUBMITTED else self.STATES.get(raw, JobState.UNKNOWN)

    @locked
    def cancel(self, job_ids: Sequence[object]) -> list[bool]:
        """Cancel these pilots (one command); they count as withdrawn from now on."""
        self.cmd.cancel([str(j) for j in job_ids])
        self.withdrawn.update(str(j) for j in job_ids)
        return [True] * len(job_ids)


def _check_arguments(walltime_min_min: int, walltime_max_min: int, notice_s: int, max_pending_s: float,
                     nodes_per_block: int, poll_s: int, max_jobs: int | None) -> None:
    if walltime_min_min < 1 or walltime_max_min < walltime_min_min:
        raise BadValue(f"pilot walltime bounds must satisfy 1 <= min <= max, got {walltime_min_min}, "
                       f"{walltime_max_min}")
    if poll_s < 1:
        raise BadValue(f"poll_s must be >= 1 second, got {poll_s}")
    if notice_s < 0:
        raise BadValue(f"notice_s must be >= 0 seconds, got {notice_s}")
    if not max_pending_s > 0:
        raise BadValue(f"max_pending_s must be > 0 seconds, got {max_pending_s}")
    if nodes_per_block < 1:
        raise BadValue(f"nodes_per_block must be >= 1, got {nodes_per_block}")
    if max_jobs is not None and max_jobs < 1:
        raise BadValue(f"max_jobs must be >= 1 or None, got {max_jobs}")
