"""The event log's vocabulary: one dataclass per kind of event the orchestrator records (JobStore.record).

Events are stored as (time, kind, JSON detail); the detail's keys are the dataclass's fields, and a field left
at ``None`` where it is marked optional is not stored (older logs and `parsl-bft status` read the same keys).
``parse_event`` reads a stored one back as the same dataclass.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar


class EventKind(StrEnum):
    """What happened; the stored ``kind`` column."""

    START = "start"
    SUBMIT = "submit"
    RECLAIM = "reclaim"
    STOP = "stop"
    STAGE = "stage"
    LAUNCH = "launch"
    STOP_REQUEST = "stop-request"
    ABANDON = "abandon"
    PLACED = "placed"
    FRAGMENT_DONE = "fragment-done"
    FRAGMENT_FAILED = "fragment-failed"
    DONE = "done"
    FAILED = "failed"
    WARM_UP_FAILED = "warm-up-failed"


class RunEnd(StrEnum):
    """Why an orchestrator life ended: a Stop event's ``why``. An error's ``why`` is "error: " and the exception
    (``RunEnd.of`` reads it as ERROR); GONE is never recorded: the reader's word for a life whose orchestrator
    died without a Stop event."""

    DONE = "done"
    TIMEOUT = "timeout"              # the run's time cap
    STOPPED = "stopped"              # stop() without a reason
    INTERRUPTED = "interrupted"      # Ctrl-C
    SIGTERM = "SIGTERM"
    ERROR = "error"
    GONE = "gone"

    @classmethod
    def of(cls, why: str) -> RunEnd | None:
        """The end a stored ``why`` names (None: none this code knows)."""
        if why.startswith(ERROR_PREFIX):
            return cls.ERROR
        try:
            return cls(why)
        except ValueError:
            return None

    @classmethod
    def error(cls, e: BaseException) -> str:
        """The ``why`` of a run that unwound with ``e``."""
        return f"{ERROR_PREFIX}{e!r}"[:200]

    @staticmethod
    def words(why: str) -> str:
        """A stored ``why`` for people: 'timeout' is the run's time cap; an error (or a word this code does not
        know) is shown as it is."""
        end = RunEnd.of(why)
        return _END_WORDS.get(end, why) if end is not None else why


ERROR_PREFIX = "error: "
_END_WORDS = {RunEnd.TIMEOUT: "time cap reached", RunEnd.STOPPED: "run stopped",
              RunEnd.INTERRUPTED: "interrupted (Ctrl-C)", RunEnd.SIGTERM: "terminated (SIGTERM)",
              RunEnd.GONE: "orchestrator gone (it ended without saying why)"}

_OPTIONAL = "optional"      # metadata key: a None value is left out of the stored detail


def _opt(default: Any = None) -> Any:
    return field(default=default, metadata={_OPTIONAL: True})


@dataclass(frozen=True)
class Event:
    """Base of every event; ``detail()`` is what the log stores beside the kind."""

    kind: ClassVar[EventKind]

    def detail(self) -> dict[str, Any]:
        """The stored JSON detail: every field, less optional ones that are None."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.metadata.get(_OPTIONAL) and getattr(self, f.name) is None)}


@dataclass(frozen=True)
class Start(Event):
    """An orchestrator life began: its generation, the jobs it took over and the step each resumes from."""

    kind = EventKind.START
    generation: str
    jobs: list[str]
    resume: dict[str, int]


@dataclass(frozen=True)
class Submit(Event):
    """A job submitted while the loop ran joined the plan."""

    kind = EventKind.SUBMIT
    job: str


@dataclass(frozen=True)
class Reclaim(Event):
    """The facility took nodes of a job back (``by``: notice or leave; ``why`` when the pool knows)."""

    kind = EventKind.RECLAIM
    job: str
    nodes: list[str]
    by: str
    why: str | None = _opt()


@dataclass(frozen=True)
class Stop(Event):
    """An orchestrator life ended, and why (done, timeout, stopped, interrupted, SIGTERM, error: ...)."""

    kind = EventKind.STOP
    generation: str
    why: str
    unfinished: list[str]


@dataclass(frozen=True)
class Stage(Event):
    """A job moved to another site; its newest good checkpoint was copied there (None: it had none)."""

    kind = EventKind.STAGE
    job: str
    to: str
    checkpoint: str | None


@dataclass(frozen=True)
class Launch(Event):
    """A fragment was launched on ``nodes`` (``site`` with several sites)."""

    kind = EventKind.LAUNCH
    job: str
    size: int
    ranks: int
    fragment: str
    nodes: list[str]
    resume_step: int
    checkpoint_every_s: float
    site: str | None = _opt()
    freeze: int | None = _opt()            # layers the fragment trains frozen (layer elasticity; None: 0)


@dataclass(frozen=True)
class StopRequest(Event):
    """A running fragment was asked to checkpoint and stop (rescale, reclaim, freeze change, shutdown)."""

    kind = EventKind.STOP_REQUEST
    job: str
    why: str


@dataclass(frozen=True)
class Abandon(Event):
    """Shares of a gang still waiting for a worker were given up (their nodes were reclaimed)."""

    kind = EventKind.ABANDON
    job: str
    fragment: str
    shares: int


@dataclass(frozen=True)
class Placed(Event):
    """Every share of a gang has landed: where its ranks run."""

    kind = EventKind.PLACED
    job: str
    fragment: str
    nodes: list[str]


@dataclass(frozen=True)
class FragmentDone(Event):
    """A fragment ended with a result (it saved its checkpoint): ``samples`` trained in it, ``ended``: unix time it
    was collected (``launched`` to ``ended`` is the node-time it held; older logs lack both). ``launched`` to
    ``train_started`` is its start: ranks started, ``restore_s`` (workload, checkpoint), ``rendezvous_s``."""

    kind = EventKind.FRAGMENT_DONE
    job: str
    fragment: str
    size: int
    ranks: int
    launched: float
    train_started: float
    train_s: float
    start_step: int
    end_step: int
    stopped_by: str
    periodic_saves: int
    checkpoint_s: float
    samples: int | None = _opt()
    ended: float | None = _opt()
    restore_s: float | None = _opt()
    rendezvous_s: float | None = _opt()


@dataclass(frozen=True)
class FragmentFailedEvent(Event):
    """A fragment ended without a result: killed by a reclaim (``reclaimed``) or failed on its own. ``lost_steps``
    and ``lost_s``: training since its last save, when its progress report says; ``launched`` and ``ended``: unix
    times (the node-time it held)."""

    kind = EventKind.FRAGMENT_FAILED
    job: str
    fragment: str
    error: str
    reclaimed: bool
    without_notice: bool
    resume_step: int
    saved_step: int
    checkpoint_every_s: float
    lost_steps: int | None = _opt()
    lost_s: float | None = _opt()
    launched: float | None = _opt()
    ended: float | None = _opt()


@dataclass(frozen=True)
class Done(Event):
    """A job finished; its final checkpoint."""

    kind = EventKind.DONE
    job: str
    checkpoint: str | None


@dataclass(frozen=True)
class Failed(Event):
    """A job gave up (a crash loop); the last error."""

    kind = EventKind.FAILED
    job: str
    error: str


@dataclass(frozen=True)
class WarmUpFailed(Event):
    """Starting the rank forkservers failed on a worker (the run goes on; ranks start cold there)."""

    kind = EventKind.WARM_UP_FAILED
    error: str


_BY_KIND: dict[str, type[Event]] = {cls.kind.value: cls for cls in Event.__subclasses__()}


def parse_event(kind: str, detail: Mapping[str, Any]) -> Event | None:
    """A stored event as its dataclass: None for a kind this parsl-bft does not know (a newer one wrote it: it is
    left out); keys the dataclass lacks are ignored. A detail that is not a mapping, or lacks a field that is not
    optional, is a ValueError naming it (a damaged log)."""
    cls = _BY_KIND.get(kind)
    if cls is None:
        return None
    if not isinstance(detail, Mapping):
        raise ValueError(f"a {kind} event's detail is not a mapping: {str(detail)[:60]!r}")
    own = fields(cls)
    missing = [f.name for f in own if f.name not in detail and f.default is MISSING]
    if missing:
        raise ValueError(f"a {kind} event without {', '.join(missing)}")
    return cls(**{f.name: detail[f.name] for f in own if f.name in detail})
