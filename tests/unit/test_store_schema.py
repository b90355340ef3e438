"""The state store's layout version: a state directory written by the unversioned store (tests/data/statedirs/v0,
see tests/data/README.md) reads as it did, read-only without a byte written, and migrates when an orchestrator
opens it; a store newer than this code is refused naming both versions, its files kept. And the store's one job
status vocabulary and typed event reads."""
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from parsl_bft.cli import main
from parsl_bft.execution import events as ev
from parsl_bft.execution.errors import StateError
from parsl_bft.execution.jobstore import SCHEMA_VERSION, STORED, JobStatus, JobStore
from parsl_bft.execution.report import read_state

V0 = Path(__file__).resolve().parents[1] / "data" / "statedirs" / "v0"
V0_STATUS = V0.with_name("v0.status.json")


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _copy(tmp_path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(V0, state)
    state.chmod(0o700)
    return state


def _status_json(state, capsys) -> dict:
    assert main(["status", str(state), "--json", "--events", "all"]) == 0
    return json.loads(capsys.readouterr().out)


def _version(db_path) -> int:
    db = sqlite3.connect(db_path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_status_reads_a_v0_state_directory_as_the_v0_code_did_without_writing_it(capsys):
    before = _digest(V0)
    assert _status_json(V0, capsys) == json.loads(V0_STATUS.read_text())
    assert _digest(V0) == before                  # read-only: migrated in memory, the file untouched


def test_an_orchestrators_open_migrates_v0_job_facts_into_the_rows(tmp_path, capsys):
    state = _copy(tmp_path)
    assert _version(state / "state.sqlite") == 0
    db = JobStore(state / "state.sqlite")
    rows = db.jobs()
    assert {n: r.status for n, r in rows.items()} == {"ok": JobStatus.DONE, "bad": JobStatus.FAILED,
                                                      "cut": JobStatus.WAITING}
    assert rows["cut"].dir == "tests/data/statedirs/.v0.tmp/state/jobs/cut" and db.site("cut") == ""
    assert db.site("ok") is None
    assert db.curve("ok", 1.0).points == {1: 95.0, 2: 180.0} and db.curve("cut", 7.0).points == {1: 7.0}
    assert db.meta("checkpoint-policy")["losses"] == 2                  # other measured values stay
    keys = [k for (k,) in db.db.execute("SELECT key FROM meta")]
    assert keys == ["checkpoint-policy"]
    db.close()
    assert _version(state / "state.sqlite") == SCHEMA_VERSION
    JobStore(state / "state.sqlite").close()                           # a migrated store opens as it is
    assert _status_json(state, capsys) == json.loads(V0_STATUS.read_text())


@pytest.mark.parametrize("readonly", [False, True])
def test_a_store_newer_than_this_code_is_refused_naming_the_versions_and_kept(tmp_path, readonly):
    state = _copy(tmp_path)
    db = sqlite3.connect(state / "state.sqlite")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    before = _digest(state)
    with pytest.raises(StateError, match=rf"layout version {SCHEMA_VERSION + 1}, and this parsl-bft reads "
                                         rf"versions up to {SCHEMA_VERSION}.*files are kept"):
        JobStore(state / "state.sqlite", readonly=readonly)
    assert _digest(state) == before


def test_a_new_store_is_made_at_the_current_version(tmp_path):
    db = JobStore(tmp_path / "s" / "state.sqlite")
    db.add("j", {"name": "j"})
    db.update("j", site="far", dir="/x/j")
    db.measured("j", 2, 50.0)
    row = db.job("j")
    assert (row.status, row.site, row.dir, db.curve("j", 1.0).points) == (JobStatus.WAITING, "far", "/x/j",
                                                                          {2: 50.0})
    db.close()
    assert _version(tmp_path / "s" / "state.sqlite") == SCHEMA_VERSION


def test_a_row_holds_only_the_stored_statuses(tmp_path):
    db = JobStore(tmp_path / "s" / "state.sqlite")
    db.add("j", {"name": "j"})
    with pytest.raises(ValueError, match="not 'stopped'"):
        db.update("j", status=JobStatus.STOPPED)      # the run's end, read from the log; never a row's
    db.holds("j", 2, 10.0)
    assert (db.job("j").status, db.job("j").size) == (JobStatus.RUNNING, 2)
    db.none_running()
    assert db.job("j").status is JobStatus.WAITING
    assert JobStatus.STOPPED not in STORED and {s for s in JobStatus if s.terminal} == {JobStatus.DONE,
                                                                                       JobStatus.FAILED}
    db.close()


def test_every_event_of_the_v0_log_reads_back_as_the_dataclass_that_wrote_it():
    db = JobStore(V0 / "state.sqlite", readonly=True)
    stored = db.events()
    db.close()
    parsed = [ev.parse_event(kind, d) for _, kind, d in stored]
    assert all(p is not None and p.kind == kind and p.detail() == d for p, (_, kind, d) in zip(parsed, stored))
    assert {type(p) for p in parsed} >= {ev.Start, ev.Launch, ev.FragmentDone, ev.FragmentFailedEvent, ev.Done,
                                         ev.Failed, ev.Reclaim, ev.StopRequest, ev.Stop}


def test_parse_event_skips_an_unknown_kind_and_refuses_a_damaged_one():
    assert ev.parse_event("from-a-newer-parsl-bft", {"job": "j"}) is None
    assert ev.parse_event("warm-up-failed", {"error": "x", "extra": 1}) == ev.WarmUpFailed("x")
    with pytest.raises(ValueError, match="a launch event without size, ranks"):
        ev.parse_event("launch", {"job": "j"})
    with pytest.raises(ValueError, match="not a mapping"):
        ev.parse_event("done", ["j"])


def test_run_end_reads_every_stored_why():
    assert [ev.RunEnd.of(w) for w in ("done", "timeout", "SIGTERM", "error: ValueError('x')", "what")] == [
        ev.RunEnd.DONE, ev.RunEnd.TIMEOUT, ev.RunEnd.SIGTERM, ev.RunEnd.ERROR, None]
    assert ev.RunEnd.words("timeout") == "time cap reached" and ev.RunEnd.words("error: boom") == "error: boom"
    assert read_state(V0)[0][2].state == "stopped: time cap reached"
