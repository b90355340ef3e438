"""The one reader of a state directory: where each job stands, for the running loop, `parsl-bft status` and the
remote side (remote/facility.py). A job's stored row is what its last collected fragment left; a running
fragment's own progress report (the job directory's progress.json) is newer."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..scaling import ScalingCurve
from ..train.protocol import JobDir, Progress
from .errors import StateError
from .jobstore import JobRow, JobStore, damaged_advice
from .statedir import DATABASE, StateDir


@dataclass
class JobReport:
    """Where one job stands: its stored row, its live progress report (if any) and, if it failed, why."""

    name: str
    row: JobRow
    live: Progress | None
    checkpoint: str | None          # absolute
    error: str | None = None

    @property
    def samples(self) -> int:
        """The job's budget of samples (0 when the stored spec has none)."""
        return int(self.row.spec.get("samples") or 0)

    @property
    def samples_now(self) -> int:
        """Samples done, counting what a running fragment has reported since its last collected result."""
        return max(self.row.samples_done, self.live.samples_done if self.live is not None else 0)


def job_dir(db: JobStore, root: Path, name: str) -> JobDir:
    """A job's directory as the orchestrator last recorded it (a site's checkpoint_dir), else the default."""
    return JobDir(db.meta(f"dir:{name}") or root / "jobs" / name)


def read_jobs(db: JobStore, root: Path) -> list[JobReport]:
    """Every job of a state directory, in submission order, with live progress and the error of failed ones."""
    sd = StateDir(root, create=False)
    errors: dict[str, str] = {}
    out = []
    for name, r in db.jobs().items():
        if r.status == "failed" and not errors:
            errors = {d["job"]: d["error"] for _, _, d in db.events("failed")}     # the newest per job
        out.append(JobReport(name, r, job_dir(db, root, name).progress(), sd.abs(r.checkpoint),
                             errors.get(name) if r.status == "failed" else None))
    return out


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
               last_events: int = 0) -> tuple[list[JobReport], list[tuple[float, str, dict[str, Any]]]]:
    """Jobs and the newest ``last_events`` events of a state directory, read-only; a damaged database is a
    StateError that says what to do."""
    db = open_state(root)
    try:
        jobs = read_jobs(db, Path(root))
        events = db.events()[-last_events:] if last_events else []
    except (sqlite3.DatabaseError, ValueError, TypeError) as e:
        raise StateError(damaged_advice(db.path, e)) from None
    finally:
        db.close()
    return jobs, events


def run_summary(db: JobStore, root: Path, curves: dict[str, ScalingCurve], *, wall_s: float, warm_up_s: float,
                pool_node_s: float) -> dict[str, Any]:
    """A run's table: per job its status, samples, node-seconds held and spent training, fragments, rescales,
    reclaims, final checkpoint and E_used (work at the job's one-node rate per node-second held); and the run's
    totals (``train_share``: held node-time spent training)."""
    rows = []
    held = trained = work = 0.0
    reclaims = [d["job"] for _, _, d in db.events("reclaim")]
    for j in read_jobs(db, root):
        r, c = j.row, curves[j.name]
        rows.append({"job": j.name, "status": r.status, "samples": r.samples_done, "node_s": r.node_s,
                     "train_node_s": r.train_node_s, "fragments": r.fragments, "rescales": r.rescales,
                     "reclaims": reclaims.count(j.name), "checkpoint": j.checkpoint,
                     "e_used": (r.samples_done / c.rate(1)) / r.node_s if r.node_s else 0.0})
        held += r.node_s
        trained += r.train_node_s
        work += r.samples_done / c.rate(1)
    return {"wall_s": wall_s, "warm_up_s": warm_up_s, "jobs": rows, "pool_node_s": pool_node_s,
            "held_node_s": held, "train_share": trained / held if held else 0.0, "e_used": work / held if held else 0.0}


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
