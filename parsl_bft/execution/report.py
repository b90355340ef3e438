"""The one reader of a state directory: where each job stands, for the running loop, `parsl-bft status` and the
remote side (remote/facility.py). A job's stored row is what its last collected fragment left; a running
fragment's own progress report (the job directory's progress.json) is newer; whether it runs, and its node-time
and E_used, come from the event log (ledger.py)."""
from __future__ import annotations

import re
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..train.metrics import FILENAME as METRICS_FILE
from ..train.protocol import JobDir, Progress
from .errors import StateError
from .events import Reclaim, RunEnd, parse_event
from .jobstore import JobRow, JobStatus, JobStore, damaged_advice
from .ledger import JobLedger, RefRate, RunLedger, ref_words
from .statedir import DATABASE, StateDir, holder_gone


@dataclass
class JobReport:
    """Where one job stands: its stored row, its live progress report (if any) and, if it failed, why."""

    name: str
    row: JobRow
    live: Progress | None
    checkpoint: str | None          # absolute
    error: str | None = None
    ledger: JobLedger | None = None  # the event log's account of it

    @property
    def state(self) -> str:
        """Where it stands: running (on how many nodes), waiting, done, failed, or stopped and why (the event
        log's word; the stored status for a job the log does not name)."""
        return self.ledger.state if self.ledger is not None else self.row.status

    @property
    def e_used(self) -> float | None:
        """Samples kept at the job's reference rate per node-second held (ledger.py); None before it held any."""
        return self.ledger.e_used(self.row.samples_done, self.row.node_s) if self.ledger is not None else None

    @property
    def measured(self) -> bool:
        """Whether a fragment of it has ended: the training share and E_used are counted then, so before it they
        are unknown (not 0%: the first fragment may be training)."""
        return self.row.fragments > 0 or (self.ledger is not None and self.ledger.fragments > 0)

    @property
    def held_node_s(self) -> float:
        """Node-seconds held: the orchestrator's count, or the event log's where that is more."""
        return max(self.row.node_s, self.ledger.held_node_s if self.ledger else 0.0)

    @property
    def training_share(self) -> float | None:
        """Of the node-seconds held, the share spent training; None before it held any or a fragment ended."""
        held = self.held_node_s
        return min(self.row.train_node_s, held) / held if held and self.measured else None

    @property
    def samples(self) -> int:
        """The job's budget of samples (0 when the stored spec has none)."""
        return int(self.row.spec.get("samples") or 0)

    @property
    def samples_now(self) -> int:
        """Samples done, counting what a running fragment has reported since its last collected result. A job
        that is not running counts what was kept: its last fragment's report may be past its newest checkpoint
        (a failed job showed 38.6% with its newest checkpoint at 12.0%)."""
        running = (self.ledger.phase if self.ledger is not None else self.row.status) is JobStatus.RUNNING
        return max(self.row.samples_done, self.live.samples_done if self.live is not None and running else 0)


STATUS_COLUMNS = ("job", "status", "progress", "fragments", "rescales", "node-s held", "training share", "E_used")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text read from a state directory as a terminal may show it: control characters other than newline and tab
    (an escape sequence a damaged or tampered database holds would retitle, clear or rewrite the terminal)
    written out as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def status_row(j: JobReport) -> tuple[str, ...]:
    """One job's row of `parsl-bft status` (``STATUS_COLUMNS``): where it stands by the event log, progress
    with a running fragment's own report, node-seconds held, the share of them spent training, and E_used."""
    r, total, held, share = j.row, j.samples, j.held_node_s, j.training_share
    loss = f", loss {j.live.loss:.4g}" if j.live is not None else ""
    e = j.e_used if j.measured else None
    return (j.name, j.state, f"{min(j.samples_now, total) / total:.1%} of {total:,}{loss}" if total else "?",
            str(r.fragments), str(r.rescales), f"{held:.0f}",
            "0%" if not held else "-" if share is None else f"{share:.0%}", "-" if e is None else f"{e:.2f}")


def status_json(jobs: list[JobReport], events: list[tuple[float, str, dict[str, Any]]]) -> dict[str, Any]:
    """`parsl-bft status --json`: each job as the table shows it, in numbers, and the events asked for."""
    out = []
    for j in jobs:
        r = j.row
        out.append({"job": j.name, "status": j.state, "phase": j.ledger.phase.value if j.ledger else r.status,
                    "samples": j.samples, "samples_done": min(j.samples_now, j.samples) if j.samples else
                    j.samples_now, "loss": j.live.loss if j.live is not None and j.live.loss == j.live.loss
                    else None, "fragments": r.fragments, "rescales": r.rescales, "node_s_held": round(j.held_node_s, 3),
                    "training_share": j.training_share,
                    "e_used": j.e_used if j.measured else None,
                    "checkpoint": j.checkpoint, "error": j.error})
    return {"jobs": out, "events": [{"t": t, "kind": kind, **d} for t, kind, d in events]}


def reference_note(jobs: list[JobReport]) -> str:
    """What E_used is measured against: each job's reference rate and when it was measured."""
    return ("E_used: samples kept at the job's reference rate (its fastest measured training rate per node) per "
            "node-second held; reference: " + "; ".join(
                f"{j.name}: {ref_words(asdict(j.ledger.ref) if j.ledger and j.ledger.ref else None)}" for j in jobs))


def job_dir(row: JobRow, root: Path) -> JobDir:
    """A job's directory as the orchestrator last recorded it (a site's checkpoint_dir), else the default."""
    return JobDir(row.dir or root / "jobs" / row.name)


def read_ledger(db: JobStore, rows: dict[str, JobRow] | None = None) -> RunLedger:
    """The event log's account of every job (``rows``: the job rows, if read already)."""
    rows = db.jobs() if rows is None else rows
    return RunLedger({n: int(r.spec.get("global_batch") or 0) for n, r in rows.items()}).feed(db.events())


def read_jobs(db: JobStore, root: Path) -> list[JobReport]:
    """Every job of a state directory, in submission order, with live progress, the event log's account and
    the error of failed ones."""
    rows = db.jobs()
    ledger = read_ledger(db, rows)
    if ledger.ended is None and ledger.started is not None and holder_gone(root) is not None:
        ledger.stopped(RunEnd.GONE)   # no Stop event, and its process is dead: nothing waits or runs
    return _reports(root, rows, ledger)


def _reports(root: Path, rows: dict[str, JobRow], ledger: RunLedger) -> list[JobReport]:
    sd = StateDir(root, create=False)
    return [JobReport(name, r, job_dir(r, root).progress(), sd.abs(r.checkpoint),
                      ledger.jobs[name].why if name in ledger.jobs and ledger.jobs[name].phase is JobStatus.FAILED
                      else None, ledger.jobs.get(name))
            for name, r in rows.items()]


def open_state(root: str | Path) -> JobStore:
    """A state directory's database, read-only (nothing is created or changed). A missing one names the state
    directories one level down (workflows keep theirs in bft-state/<workflow>)."""
    db_path = Path(root) / DATABASE
    if not db_path.is_file():
        inside = sorted(str(p.parent) for p in Path(root).glob(f"*/{DATABASE}"))
        hint = f"; state directories in it: {', '.join(inside)}" if inside else ""
        raise FileNotFoundError(f"no orchestrator state at {db_path}{hint}")
    return JobStore(db_path, readonly=True)


def read_state(root: str | Path, *,
               last_events: int | None = 0) -> tuple[list[JobReport], list[tuple[float, str, dict[str, Any]]]]:
    """Jobs and the newest ``last_events`` events (None: all) of a state directory, read-only; a damaged
    database is a StateError that says what to do. (Whether the run has ended: ``RunLedger.ended``.)"""
    db = open_state(root)
    try:
        jobs = read_jobs(db, Path(root))
        events = db.events() if last_events is None else db.events()[-last_events:] if last_events else []
    except (sqlite3.DatabaseError, ValueError, TypeError) as e:
        raise StateError(damaged_advice(db.path, e)) from None
    finally:
        db.close()
    return jobs, events


def metrics_file(root: str | Path, job: str | None = None) -> tuple[str, Path]:
    """The job (``job``, or the state directory's only one) and its metrics.csv (``train.metrics``), read-only;
    an unknown or ambiguous job is refused naming the jobs there."""
    db = open_state(root)
    try:
        rows = db.jobs()
        names = list(rows)
        if job is None and len(names) != 1:
            raise StateError(f"{root} holds {len(names)} jobs ({', '.join(names) or 'none'}): name one")
        name = job if job is not None else names[0]
        if name not in names:
            raise StateError(f"{root} has no job {name!r}; its jobs: {', '.join(names) or 'none'}")
        return name, job_dir(rows[name], Path(root)).path / METRICS_FILE
    except sqlite3.DatabaseError as e:
        raise StateError(damaged_advice(db.path, e)) from None
    finally:
        db.close()


@dataclass(frozen=True, kw_only=True)
class JobSummary:
    """One job's line of a run's summary."""

    job: str
    status: JobStatus           # the event log's phase, or the row's where the log does not name the job
    state: str                  # where it stands, in words
    samples: int                # samples done
    node_s: float               # node-seconds held
    train_node_s: float         # node-seconds spent training
    fragments: int
    rescales: int
    reclaims: int
    checkpoint: str | None      # absolute: the final one, or the newest kept
    e_used: float | None        # None before the job held nodes
    ref_rate: RefRate | None    # what E_used is measured against (ledger.py)


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What ``Orchestrator.run()`` (and ``stop()``) return: each job's line and the run's totals."""

    wall_s: float
    warm_up_s: float
    jobs: tuple[JobSummary, ...]
    pool_node_s: float          # node-seconds the idle pool offered
    held_node_s: float          # node-seconds the jobs held
    train_share: float          # of the held node-time, the share spent training
    e_used: float
    ended: str | None           # why the run ended ('done', 'timeout': its time cap, ...); None: it goes on

    def as_dict(self) -> dict[str, Any]:
        """As JSON holds it: the jobs a list of their fields, ``ref_rate`` one of its fields."""
        return {**asdict(self), "jobs": [asdict(j) for j in self.jobs]}


def run_summary(db: JobStore, root: Path, *, wall_s: float, warm_up_s: float, pool_node_s: float) -> RunSummary:
    """A run's table (``RunSummary``): per job where it stands, samples, node-seconds held and spent training,
    fragments, rescales, reclaims, final checkpoint, E_used and the reference rate it is measured against; and
    the run's totals and why it ended."""
    rows = []
    held = trained = work = 0.0
    reclaims = [ev.job for _, kind, d in db.events(Reclaim.kind) if isinstance(ev := parse_event(kind, d), Reclaim)]
    job_rows = db.jobs()
    ledger = read_ledger(db, job_rows)            # the event log read once: the jobs' accounts and why it ended
    jobs = _reports(root, job_rows, ledger)
    for j in jobs:
        r, lj = j.row, j.ledger
        job_held = j.held_node_s
        rows.append(JobSummary(job=j.name, status=lj.phase if lj else r.status, state=j.state,
                               samples=r.samples_done, node_s=job_held, train_node_s=r.train_node_s,
                               fragments=r.fragments, rescales=r.rescales, reclaims=reclaims.count(j.name),
                               checkpoint=j.checkpoint, e_used=j.e_used, ref_rate=lj.ref if lj else None))
        held += job_held
        trained += min(r.train_node_s, job_held)
        if lj is not None and lj.ref is not None:
            work += min(r.samples_done, lj.kept) / lj.ref.per_node_s
    return RunSummary(wall_s=wall_s, warm_up_s=warm_up_s, jobs=tuple(rows), pool_node_s=pool_node_s,
                      held_node_s=held, train_share=trained / held if held else 0.0,
                      e_used=work / held if held else 0.0, ended=ledger.ended)


def live_progress(db: JobStore, jobs: dict[str, tuple[int, Path]]) -> dict[str, float]:
    """Samples done per job (``jobs``: name -> its budget and job directory), counting what a running fragment
    has reported since its last collected result, capped at the budget."""
    rows = db.jobs()
    out: dict[str, float] = {}
    for name, (budget, d) in jobs.items():
        done = rows[name].samples_done if name in rows else 0
        p = JobDir(d).progress()
        out[name] = min(max(done, p.samples_done) if p is not None else done, budget)
    return out
