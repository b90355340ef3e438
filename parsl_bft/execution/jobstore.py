"""The orchestrator's persistent state (SQLite): typed job rows, the event log and a few measured values.
A restarted orchestrator picks every job up again from here.

The store carries its layout's version (``PRAGMA user_version``, ``SCHEMA_VERSION``). Opening an older one
migrates it (a read-only open migrates a copy in memory, the file is left as it is); one newer than this code is
refused, naming both versions, with its files untouched. Versions: 0, the unversioned layout (a job's site, job
directory and measured curve as ``meta`` rows "site:NAME", "dir:NAME", "curve:NAME"); 1, those as columns of
the job's row."""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..scaling import ScalingCurve
from .errors import StateError
from .events import Event

__all__ = ["SCHEMA_VERSION", "JobRow", "JobStatus", "JobStore", "StateError", "damaged_advice"]


class JobStatus(StrEnum):
    """Where a job stands: the one vocabulary of the job row, the event log's account (ledger.py), `parsl-bft
    status` and the remote side. A row holds one of ``STORED``; ``STOPPED`` is never stored: the run's end is a
    run-level fact (the Stop event, ``RunEnd``), and a job that was neither done nor failed then reads as
    stopped until a next run takes it up again (its row says waiting, which is what that next run needs)."""

    WAITING = "waiting"        # no fragment running now (between fragments, or planned no nodes)
    RUNNING = "running"        # a fragment was launched and has not ended
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"        # the run ended before the job did; its newest checkpoint stays

    @property
    def terminal(self) -> bool:
        """Done or failed: nothing more happens to the job (a stopped one goes on in a next run)."""
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.DONE, JobStatus.FAILED})
STORED = (JobStatus.WAITING, JobStatus.RUNNING, JobStatus.DONE, JobStatus.FAILED)    # what a job row may hold

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, samples_done INTEGER NOT NULL,
    checkpoint TEXT, rescales INTEGER NOT NULL DEFAULT 0, reclaims INTEGER NOT NULL DEFAULT 0,
    fragments INTEGER NOT NULL DEFAULT 0, node_s REAL NOT NULL DEFAULT 0, train_node_s REAL NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL, site TEXT, dir TEXT, curve TEXT);
CREATE TABLE IF NOT EXISTS events (t REAL NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _v0_to_v1(db: sqlite3.Connection) -> None:
    """The per-job ``meta`` rows "site:NAME", "dir:NAME", "curve:NAME" become the row's columns."""
    for column in ("site", "dir", "curve"):
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column} TEXT")
        for key, value in db.execute("SELECT key, value FROM meta WHERE key LIKE ?", (column + ":%",)).fetchall():
            v = json.loads(value)
            db.execute(f"UPDATE jobs SET {column} = ? WHERE name = ?",
                       (json.dumps(v) if column == "curve" else v, key[len(column) + 1:]))
        db.execute("DELETE FROM meta WHERE key LIKE ?", (column + ":%",))


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _v0_to_v1}    # from version N to N + 1


def layout_version(db: sqlite3.Connection, path: Path) -> int:
    """The store's layout version; one newer than this code's is refused (StateError naming both)."""
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StateError(f"state database {path} has layout version {version}, and this parsl-bft reads versions "
                         f"up to {SCHEMA_VERSION}: use the parsl-bft that wrote it, or a newer one (its files "
                         "are kept as they are)")
    return version


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring a store (autocommit connection) to ``SCHEMA_VERSION``: a new one is created, an older one migrated
    in one transaction, a newer one refused (StateError naming the versions; nothing is changed)."""
    version = layout_version(db, path)
    if version == SCHEMA_VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone() is None:
            for statement in filter(str.strip, SCHEMA.split(";")):      # a new store
                db.execute(statement)
        else:
            for v in range(version, SCHEMA_VERSION):
                MIGRATIONS[v](db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


@dataclass
class JobRow:
    """One job's row: its spec (as the workflow gave it), where it stands, and what it has cost so far."""

    name: str
    spec: dict[str, Any]
    status: JobStatus = JobStatus.WAITING      # one of STORED
    samples_done: int = 0
    checkpoint: str | None = None
    rescales: int = 0
    reclaims: int = 0
    fragments: int = 0
    node_s: float = 0.0            # node-seconds held
    train_node_s: float = 0.0      # node-seconds spent training
    size: int = 0
    updated: float = 0.0
    site: str | None = None        # the site it last ran at (None: the first one)
    dir: str | None = None         # its job directory, as the orchestrator last recorded it


_COLUMNS = [f.name for f in fields(JobRow)]
log = logging.getLogger("parsl_bft.events")


def damaged_advice(path: Path, err: object) -> str:
    """What to tell a user whose state database cannot be read: the checkpoints are safe, and how to go on."""
    return (f"state database {path} is damaged or not an orchestrator's ({err}). The checkpoints under "
            f"{path.parent}/jobs are kept: move {path.name} aside (e.g. to {path.name}.damaged) and submit the jobs "
            "again - each resumes from its newest good checkpoint")


class JobStore:
    """``readonly``: for ``parsl-bft status`` - nothing is created or changed, a damaged database is a StateError."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            if readonly:
                # no -shm beside it: no orchestrator has it open; immutable then creates no -wal/-shm files either
                live = self.path.with_name(self.path.name + "-shm").exists()
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro{'' if live else '&immutable=1'}", uri=True,
                                          isolation_level=None, timeout=30)
                self.db.execute("SELECT count(*) FROM jobs").fetchone()
                if layout_version(self.db, self.path) < SCHEMA_VERSION:
                    self._migrated_copy()
                return
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            # the orchestrator's loop thread and the workflow's thread share it (SQLite is serialized here)
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
            layout_version(self.db, self.path)         # a newer one is refused before anything is written
            self.db.execute("PRAGMA journal_mode=WAL")
            migrate(self.db, self.path)
            self.db.execute("SELECT count(*) FROM jobs").fetchone()
        except (sqlite3.DatabaseError, ValueError) as e:     # ValueError: a migrated value that is not JSON
            self._close_refused()
            raise StateError(damaged_advice(self.path, e)) from None
        except StateError:
            self._close_refused()
            raise

    def _close_refused(self) -> None:
        if hasattr(self, "db"):
            self.db.close()

    def _migrated_copy(self) -> None:
        """Read an older store without writing it: its copy in memory, migrated."""
        mem = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.db.backup(mem)
        self.db.close()
        self.db = mem
        migrate(mem, self.path)

    def jobs(self) -> dict[str, JobRow]:
        """Every job's row, by name, in the order they were added."""
        cur = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY rowid")
        out = {}
        for row in cur:
            d = dict(zip(_COLUMNS, row))
            try:
                d["spec"] = json.loads(d["spec"])
                if not isinstance(d["spec"], dict):
                    raise ValueError("the spec is not a mapping")
                d["status"] = JobStatus(d["status"])
            except (TypeError, ValueError, RecursionError) as e:
                raise StateError(damaged_advice(self.path, f"job {d['name']!r}: {e}")) from None
            out[d["name"]] = JobRow(**d)
        return out

    def job(self, name: str) -> JobRow:
        """One job's row (KeyError: no such job)."""
        return self.jobs()[name]

    def add(self, name: str, spec: dict[str, Any]) -> None:
        """A new job, waiting; a job of that name already there is left as it is."""
        self.db.execute("INSERT INTO jobs (name, spec, status, samples_done, updated) VALUES (?, ?, ?, 0, ?)"
                        " ON CONFLICT(name) DO NOTHING", (name, json.dumps(spec), JobStatus.WAITING, time.time()))

    def update(self, name: str, **values: Any) -> None:
        """Set some of a job's fields (``JobRow``'s, but not name, spec or updated)."""
        bad = [k for k in values if k not in _COLUMNS or k in ("name", "spec", "updated")]
        if bad:
            raise KeyError(f"not a job field: {', '.join(bad)}")
        if "status" in values and values["status"] not in STORED:
            raise ValueError(f"a job row holds {', '.join(STORED)}, not {str(values['status'])!r}")
        if values:
            sets = ", ".join(f"{k} = ?" for k in values)
            self.db.execute(f"UPDATE jobs SET {sets}, updated = ? WHERE name = ?",
                            (*values.values(), time.time(), name))

    def holds(self, name: str, size: int, node_s: float) -> None:
        """A job holds ``size`` nodes now (running if any, else waiting), having held ``node_s`` node-seconds."""
        self.update(name, status=JobStatus.RUNNING if size else JobStatus.WAITING, size=size, node_s=node_s)

    def none_running(self) -> None:
        """The run has ended: no job holds nodes any more (running ones wait for the next run)."""
        self.db.execute("UPDATE jobs SET status = ?, size = 0, updated = ? WHERE status = ?",
                        (JobStatus.WAITING, time.time(), JobStatus.RUNNING))

    def record(self, ev: Event) -> None:
        """Append one event to the log (and to the ``parsl_bft.events`` logger, at INFO)."""
        text = json.dumps(ev.detail())
        log.info("%s %s", ev.kind.value, text[:500])
        self.db.execute("INSERT INTO events VALUES (?, ?, ?)", (time.time(), ev.kind.value, text))

    def events(self, kind: str | None = None) -> list[tuple[float, str, dict[str, Any]]]:
        """The event log (of one ``kind`` if given), oldest first: (unix time, kind, fields)."""
        q = "SELECT t, kind, detail FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY rowid"
        return [(t, k, json.loads(d)) for t, k, d in self.db.execute(q, (kind,) if kind else ())]

    def events_after(self, rowid: int) -> tuple[int, list[tuple[float, str, dict[str, Any]]]]:
        """Events appended after row ``rowid`` (0: all), oldest first, and the newest row's id (to ask again)."""
        rows = self.db.execute("SELECT rowid, t, kind, detail FROM events WHERE rowid > ? ORDER BY rowid",
                               (rowid,)).fetchall()
        return (rows[-1][0] if rows else rowid), [(t, k, json.loads(d)) for _, t, k, d in rows]

    def set_meta(self, key: str, value: Any) -> None:
        """Keep one measured value (JSON) under ``key``."""
        self.db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (key, json.dumps(value)))

    def meta(self, key: str, default: Any = None) -> Any:
        """The value kept under ``key`` (``default`` if none)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def _column(self, name: str, column: str) -> Any:
        row = self.db.execute(f"SELECT {column} FROM jobs WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def site(self, name: str) -> str | None:
        """The site a job last ran at (None: not recorded, or no such job)."""
        site: str | None = self._column(name, "site")
        return site

    def curve(self, name: str, rate_guess: float) -> ScalingCurve:
        """A job's measured throughput curve, or the guess until its first measurement (guessed and measured
        points are never mixed)."""
        text = self._column(name, "curve")
        measured = json.loads(text) if text else None
        return ScalingCurve(name, {int(k): v for k, v in measured.items()} if measured else {1: rate_guess})

    def measured(self, name: str, nodes: int, throughput: float) -> ScalingCurve:
        """Record a fragment's measured throughput on ``nodes`` nodes; the job's measured curve after it."""
        text = self._column(name, "curve")
        points = {int(n): v for n, v in (json.loads(text) if text else {}).items()}
        points[nodes] = throughput
        self.db.execute("UPDATE jobs SET curve = ? WHERE name = ?", (json.dumps(points), name))
        return ScalingCurve(name, points)

    def close(self) -> None:
        """Close the database."""
        self.db.close()
