"""The orchestrator's persistent state (SQLite): a restarted orchestrator picks every job up again."""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, samples_done INTEGER NOT NULL,
    checkpoint TEXT, rescales INTEGER NOT NULL DEFAULT 0, reclaims INTEGER NOT NULL DEFAULT 0,
    fragments INTEGER NOT NULL DEFAULT 0, node_s REAL NOT NULL DEFAULT 0, train_node_s REAL NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (t REAL NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StateDB:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def jobs(self) -> dict[str, dict]:
        cur = self.db.execute("SELECT name, spec, status, samples_done, checkpoint, rescales, reclaims, fragments, "
                              "node_s, train_node_s, size, updated FROM jobs ORDER BY rowid")
        cols = [c[0] for c in cur.description]
        out = {}
        for row in cur:
            d = dict(zip(cols, row))
            d["spec"] = json.loads(d["spec"])
            out[d["name"]] = d
        return out

    def upsert(self, name: str, spec: dict, **fields) -> None:
        with self.db:
            self.db.execute("INSERT INTO jobs (name, spec, status, samples_done, updated) VALUES (?, ?, 'waiting', 0, ?)"
                            " ON CONFLICT(name) DO NOTHING", (name, json.dumps(spec), time.time()))
            if fields:
                sets = ", ".join(f"{k} = ?" for k in fields)
                self.db.execute(f"UPDATE jobs SET {sets}, updated = ? WHERE name = ?",
                                (*fields.values(), time.time(), name))

    def event(self, kind: str, **detail) -> None:
        self.db.execute("INSERT INTO events VALUES (?, ?, ?)", (time.time(), kind, json.dumps(detail)))

    def events(self, kind: str | None = None) -> list[tuple[float, str, dict]]:
        q = "SELECT t, kind, detail FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY rowid"
        return [(t, k, json.loads(d)) for t, k, d in self.db.execute(q, (kind,) if kind else ())]

    def set_meta(self, key: str, value) -> None:
        self.db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (key, json.dumps(value)))

    def meta(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def close(self) -> None:
        self.db.close()
