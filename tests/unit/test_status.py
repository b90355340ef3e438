"""`parsl-bft status`: every event on request (--events N|all), JSON (--json), "interrupted" after Ctrl-C as the
docs promise, and no job shown waiting or running once the orchestrator that held the state directory is dead."""
import json
import os
import socket
import subprocess
import sys

import pytest

from parsl_bft.cli import main
from parsl_bft.execution import events as ev
from parsl_bft.execution.jobstore import JobStore
from parsl_bft.execution.report import read_state
from parsl_bft.execution.training_job import TrainingJob


def _state(tmp_path, n_events=12):
    """A run in the middle: a Start, then n_events launches of job j (no Stop yet)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = JobStore(state / "state.sqlite")
    db.add("j", {"name": "j", "samples": 1000, "global_batch": 10})
    db.record(ev.Start("g1", ["j"], {"j": 0}))
    for i in range(n_events - 1):
        db.record(ev.Launch("j", 1, 1, f"j-{i}", ["n0"], 0, 10.0))
    db.close()
    return state


def _holder(state, pid):
    (state / "orchestrator.lock").write_text(f"pid {pid} on {socket.gethostname()}, since 2026-11-29 00:00:00\n")


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_events_all_shows_every_event_and_n_the_newest_n(tmp_path, capsys):
    state = _state(tmp_path)
    _holder(state, os.getpid())
    assert main(["status", str(state)]) == 0
    assert capsys.readouterr().out.count('"job": "j"') == 5                   # the default: the newest five
    assert main(["status", str(state), "--events", "all"]) == 0
    out = capsys.readouterr().out
    assert out.count('"fragment": "j-') == 11 and '"generation": "g1"' in out      # the start too
    assert main(["status", str(state), "--events", "2"]) == 0
    out = capsys.readouterr().out
    assert '"fragment": "j-9"' in out and '"fragment": "j-8"' not in out
    assert main(["status", str(state), "--events", "some"]) == 2
    assert "--events is a number of events >= 0 or 'all', got 'some'" in capsys.readouterr().err


def test_json_has_the_jobs_and_the_events_asked_for(tmp_path, capsys):
    state = _state(tmp_path, n_events=3)
    _holder(state, os.getpid())
    assert main(["status", str(state), "--json", "--events", "all"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (job,) = doc["jobs"]
    assert (job["job"], job["status"], job["phase"], job["samples"], job["samples_done"]) == \
        ("j", "running on 1 node(s)", "running", 1000, 0)
    assert [e["kind"] for e in doc["events"]] == ["start", "launch", "launch"]
    assert doc["events"][1]["fragment"] == "j-0" and isinstance(doc["events"][0]["t"], float)


def test_a_state_directory_whose_orchestrator_died_without_a_stop_shows_no_job_waiting(tmp_path):
    """After a second Ctrl-C (or kill -9) no Stop event was written: status said 'running'/'waiting' as if the
    run were alive. The lock names the dead pid."""
    state = _state(tmp_path, n_events=2)
    _holder(state, os.getpid())                                  # alive: as it was
    assert read_state(state)[0][0].state == "running on 1 node(s)"
    _holder(state, _dead_pid())
    assert read_state(state)[0][0].state == "stopped: orchestrator gone (it ended without saying why)"
    (state / "orchestrator.lock").write_text("pid 1 on another-host, since 2026-11-29 00:00:00\n")
    assert read_state(state)[0][0].state == "running on 1 node(s)"    # another host's: cannot tell from here


def test_a_run_stopped_by_ctrl_c_says_interrupted(tmp_path):
    """A session passes the reason it unwinds with to stop(); the background loop recorded 'stopped'."""
    from simulated import RATE, ScriptedPool, SimulatedFragments, _orchestrator

    from parsl_bft.execution.clock import SimulatedClock

    clock = SimulatedClock()
    orch = _orchestrator(tmp_path, clock, ScriptedPool(clock, []), SimulatedFragments(clock), poll_s=0.05)
    orch.submit(TrainingJob("j", samples=1_000, max_nodes=1, global_batch=8, rate_guess=RATE))
    orch.start()
    orch.stop("interrupted")
    orch.close()
    assert [d["why"] for _, _, d in JobStore(tmp_path / "state" / "state.sqlite").events("stop")] == ["interrupted"]
    jobs, _ = read_state(tmp_path / "state")
    assert jobs[0].state == "stopped: interrupted (Ctrl-C)"


def test_training_share_and_e_used_are_unknown_until_a_fragment_ends(tmp_path, capsys):
    """While the first fragment trains, the job has held nodes but nothing is counted yet: status showed
    "training share 0%, E_used 0.00"; it shows "-" (JSON: null) until a fragment has ended."""
    state = _state(tmp_path, n_events=2)              # one launch, running
    db = JobStore(state / "state.sqlite")
    db.update("j", node_s=40.0)                       # the orchestrator's count of node-seconds held so far
    db.close()
    assert main(["status", str(state), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["node_s_held"] == 40.0 and job["training_share"] is None and job["e_used"] is None
    db = JobStore(state / "state.sqlite")
    db.record(ev.FragmentDone("j", "j-0", 1, 1, 0.0, 1.0, 30.0, 0, 30, "signal", 0, 0.1, samples=300, ended=41.0))
    db.update("j", fragments=1, train_node_s=30.0, samples_done=300)
    db.close()
    assert main(["status", str(state), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["training_share"] == pytest.approx(30.0 / job["node_s_held"]) and job["e_used"] > 0
