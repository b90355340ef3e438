"""The orchestrator's persistent state (SQLite): typed job rows, the event log and a few measured values.
A restarted orchestrator picks every job up again from here."""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..scaling import ScalingCurve
from .errors import StateError
from .events import Event

__all__ = ["JobRow", "JobStore", "StateError", "damaged_advice"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, samples_done INTEGER NOT NULL,
    checkpoint TEXT, rescales INTEGER NOT NULL DEFAULT 0, reclaims INTEGER NOT NULL DEFAULT 0,
    fragments INTEGER NOT NULL DEFAULT 0, node_s REAL NOT NULL DEFAULT 0, train_node_s REAL NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (t REAL NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class JobRow:
    """One job's row: its spec (as the workflow gave it), where it stands, and what it has cost so far."""

    name: str
    spec: dict[str, Any]
    status: str = "waiting"        # waiting | running | done | failed
    samples_done: int = 0
    checkpoint: str | None = None
    rescales: int = 0
    reclaims: int = 0
    fragments: int = 0
    node_s: float = 0.0            # node-seconds held
    train_node_s: float = 0.0      # node-seconds spent training
    size: int = 0
    updated: float = 0.0


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
                return
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            # the orchestrator's loop thread and the workflow's thread share it (SQLite is serialized here)
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SCHEMA)
            self.db.execute("SELECT count(*) FROM jobs").fetchone()
        except sqlite3.DatabaseError as e:
            raise StateError(damaged_advice(self.path, e)) from None

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
            except (TypeError, ValueError, RecursionError) as e:
                raise StateError(damaged_advice(self.path, f"job {d['name']!r}: {e}")) from None
            out[d["name"]] = JobRow(**d)
        return out

    def job(self, name: str) -> JobRow:
        """One job's row (KeyError: no such job)."""
        return self.jobs()[name]

    def add(self, name: str, spec: dict[str, Any]) -> None:
        """A new job, waiting; a job of that name already there is left as it is."""
        self.db.execute("INSERT INTO jobs (name, spec, status, samples_done, updated) VALUES (?, ?, 'waiting', 0, ?)"
                        " ON CONFLICT(name) DO NOTHING", (name, json.dumps(spec), time.time()))

    def update(self, name: str, **values: Any) -> None:
        """Set some of a job's fields (``JobRow``'s, but not name, spec or updated)."""
        bad = [k for k in values if k not in _COLUMNS or k in ("name", "spec", "updated")]
        if bad:
            raise KeyError(f"not a job field: {', '.join(bad)}")
        if values:
            sets = ", ".join(f"{k} = ?" for k in values)
            self.db.execute(f"UPDATE jobs SET {sets}, updated = ? WHERE name = ?",
                            (*values.values(), time.time(), name))

    def none_running(self) -> None:
        """The run has ended: no job holds nodes any more (running ones wait for the next run)."""
        self.db.execute("UPDATE jobs SET status = 'waiting', size = 0, updated = ? WHERE status = 'running'",
                        (time.time(),))

    def record(self, ev: Event) -> None:
        """Append one event to the log (and to the ``parsl_bft.events`` logger, at INFO)."""
        self.event(ev.kind.value, **ev.detail())

    def event(self, kind: str, **detail: Any) -> None:
        """Append an event given as a kind and its fields (``record`` takes a typed Event)."""
        text = json.dumps(detail)
        log.info("%s %s", kind, text[:500])
        self.db.execute("INSERT INTO events VALUES (?, ?, ?)", (time.time(), kind, text))

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

    def curve(self, name: str, rate_guess: float) -> ScalingCurve:
        """A job's measured throughput curve, or the guess until its first measurement (guessed and measured
        points are never mixed)."""
        measured = self.meta(f"curve:{name}")
        return ScalingCurve(name, {int(k): v for k, v in measured.items()} if measured else {1: rate_guess})

    def measured(self, name: str, nodes: int, throughput: float) -> ScalingCurve:
        """Record a fragment's measured throughput on ``nodes`` nodes; the job's measured curve after it."""
        points = {int(n): v for n, v in (self.meta(f"curve:{name}") or {}).items()}
        points[nodes] = throughput
        self.set_meta(f"curve:{name}", points)
        return ScalingCurve(name, points)

    def close(self) -> None:
        """Close the database."""
        self.db.close()
