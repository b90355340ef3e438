"""`parsl-bft run`'s progress without a terminal: plain lines at a steady interval, and each job's state as the
event log tells it (a failed job is not shown as done, a fragment that is still saving shows as running, a run
cut by its time cap says so); E_used from the event log never above 1."""
import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from parsl_bft.execution import events as ev
from parsl_bft.execution.jobstore import JobStatus, JobStore
from parsl_bft.execution.ledger import RunLedger
from parsl_bft.execution.live import LiveBars
from parsl_bft.execution.report import run_summary


def _launch(db, job, fragment, size):
    db.record(ev.Launch(job, size, size, fragment, [f"n{i}" for i in range(size)], 0, 10.0))


def _done(db, job, fragment, size, *, launched, ended, train_s, steps, start=0, batch=10):
    db.record(ev.FragmentDone(job, fragment, size, size, launched, launched + 1, train_s, start, start + steps,
                              "signal", 0, 0.1, samples=steps * batch, ended=ended))


def _orch(tmp_path):
    db = JobStore(tmp_path / "state.sqlite")
    names = ("ok", "bad", "cut", "busy")
    for n in names:
        db.add(n, {"name": n, "samples": 1000, "global_batch": 10})
    db.record(ev.Start("g1", list(names), {n: 0 for n in names}))
    for n in names:
        _launch(db, n, f"{n}-1", 2)
    _done(db, "ok", "ok-1", 2, launched=0.0, ended=60.0, train_s=50.0, steps=100)
    db.record(ev.Done("ok", "/x/ok/ckpt-100.h5"))
    db.record(ev.FragmentFailedEvent("bad", "bad-1", "ValueError", False, True, 0, 0, 10.0))
    db.record(ev.Failed("bad", "ValueError"))
    db.update("busy", status="waiting", size=0)       # planned no nodes: its fragment is still saving
    return SimpleNamespace(
        db=db, jobs={n: SimpleNamespace(samples=1000, global_batch=10) for n in names},
        last_report=lambda n: SimpleNamespace(loss=0.5) if n == "busy" else None,
        live_progress=lambda: {"ok": 1000, "bad": 300, "cut": 500, "busy": 250})


def test_without_a_terminal_progress_is_plain_lines_at_an_interval_and_a_last_word(tmp_path):
    out = io.StringIO()
    orch = _orch(tmp_path)
    with LiveBars(Console(file=io.StringIO(), force_terminal=False), every_s=3600, plain_to=out) as bars:
        assert out.getvalue().endswith(" starting workers\n")        # said before the quiet start-up
        bars(orch)
        bars(orch)                      # within the interval: nothing new
        lines = out.getvalue().splitlines()[1:]
        assert len(lines) == 4
        now = {line.split()[2].rstrip(":"): line for line in lines}
        assert now["busy"].endswith("25.0% of 1,000 samples, running on 2 node(s), loss 0.5")
        assert now["cut"].endswith("50.0% of 1,000 samples, running on 2 node(s)")
        orch.db.record(ev.Stop("g1", "timeout", ["busy", "cut"]))     # the run's time cap
    lines = out.getvalue().splitlines()[1:]
    assert len(lines) == 8              # the last word, at exit
    last = {line.split()[2].rstrip(":"): line for line in lines[4:]}
    assert last["ok"].endswith("100.0% of 1,000 samples, done")
    assert last["bad"].endswith("30.0% of 1,000 samples, failed")
    assert last["cut"].endswith("50.0% of 1,000 samples, stopped: time cap reached")
    assert last["busy"].endswith("25.0% of 1,000 samples, stopped: time cap reached, loss 0.5")


def test_e_used_is_at_most_one_against_the_fastest_rate_the_job_measured(tmp_path):
    """A rate guessed before training, or one measured while the machine was loaded, made E_used 2.3. The
    reference is the job's fastest measured per-node rate: a fragment at half speed shows as 0.5, none above 1."""
    db = JobStore(tmp_path / "state.sqlite")
    db.add("j", {"name": "j", "samples": 10_000, "global_batch": 10})
    db.record(ev.Start("g1", ["j"], {"j": 0}))
    _launch(db, "j", "j-1", 1)
    _done(db, "j", "j-1", 1, launched=0.0, ended=100.0, train_s=100.0, steps=100)          # 10 samples/s/node
    _launch(db, "j", "j-2", 2)
    _done(db, "j", "j-2", 2, launched=200.0, ended=300.0, train_s=100.0, steps=100, start=100)   # 5 /s/node
    db.update("j", samples_done=2000, node_s=250.0, train_node_s=300.0)   # the loop's own count may lag
    ledger = RunLedger({"j": 10}).feed(db.events())
    j = ledger.jobs["j"]
    assert j.ref is not None and (j.ref.per_node_s, j.ref.fragment, j.ref.nodes) == (10.0, "j-1", 1)
    assert j.held_node_s == 300.0 and j.kept == 2000
    assert j.e_used(2000, 250.0) == pytest.approx(2000 / 10.0 / 300.0)
    summary = run_summary(db, tmp_path, wall_s=300.0, warm_up_s=0.0, pool_node_s=600.0)
    (row,) = summary.jobs
    assert row.e_used == pytest.approx(2 / 3) and summary.e_used == pytest.approx(2 / 3)
    assert row.ref_rate.fragment == "j-1" and row.node_s == 300.0 and summary.train_share <= 1.0
    assert row.status == "waiting" and summary.ended is None        # the run goes on
    assert summary.as_dict()["jobs"][0]["ref_rate"]["fragment"] == "j-1"     # as JSON holds it


def test_a_new_life_starts_from_where_the_log_stands(tmp_path):
    """A life killed outright left a fragment without an end: the next life's start does not count it as
    running; a failed fragment's saved work counts as kept."""
    db = JobStore(tmp_path / "state.sqlite")
    db.record(ev.Start("g1", ["j"], {"j": 0}))
    _launch(db, "j", "j-1", 1)
    db.record(ev.Start("g2", ["j"], {"j": 40}))
    ledger = RunLedger({"j": 10}).feed(db.events())
    assert ledger.jobs["j"].phase is JobStatus.WAITING and ledger.jobs["j"].saved_step == 40
    _launch(db, "j", "j-2", 1)
    db.record(ev.FragmentFailedEvent("j", "j-2", "killed", True, True, 40, 60, 10.0, launched=0.0, ended=50.0))
    ledger = RunLedger({"j": 10}).feed(db.events())
    j = ledger.jobs["j"]
    assert (j.kept, j.held_node_s, j.ref.per_node_s, j.phase) == (200, 50.0, 4.0, JobStatus.WAITING)


def test_progress_lines_show_samples_per_second_and_an_eta_once_known(tmp_path):
    out, now = io.StringIO(), [100.0]
    orch = _orch(tmp_path)
    done = {"ok": 1000, "bad": 300, "cut": 500, "busy": 250}
    orch.live_progress = lambda: dict(done)
    with LiveBars(Console(file=io.StringIO(), force_terminal=False), every_s=10, plain_to=out,
                  clock=lambda: now[0]) as bars:
        bars(orch)
        assert "samples/s" not in out.getvalue()          # one look: no speed yet
        now[0] += 20.0
        done["busy"] = 450                                # 200 samples in 20 s
        bars(orch)
        busy = [line for line in out.getvalue().splitlines() if " busy: " in line][-1]
        assert busy.endswith("45.0% of 1,000 samples, running on 2 node(s), loss 0.5, 10 samples/s, ETA 55s")
        cut = [line for line in out.getvalue().splitlines() if " cut: " in line][-1]
        assert cut.endswith("running on 2 node(s), 0 samples/s")     # not moving: no ETA
        ok = [line for line in out.getvalue().splitlines() if " ok: " in line][-1]
        assert ok.endswith("100.0% of 1,000 samples, done")             # done: neither


def test_a_duration_reads_in_seconds_minutes_or_hours():
    from parsl_bft.execution.live import _duration
    assert [_duration(s) for s in (5, 65, 3 * 3600 + 7 * 60 + 30)] == ["5s", "1m05s", "3h07m"]


def test_a_fragment_launched_with_frozen_layers_says_so(tmp_path):
    """The freeze level a fragment trains at is in its launch event and in where the job stands (status, live
    lines); a fragment with none says nothing of it, and the stored event leaves the field out."""
    db = JobStore(tmp_path / "state.sqlite")
    db.add("j", {"name": "j", "samples": 10_000, "global_batch": 10})
    db.record(ev.Start("g1", ["j"], {"j": 0}))
    db.record(ev.Launch("j", 2, 2, "j-1", ["n0", "n1"], 0, 10.0, freeze=3))
    ledger = RunLedger({"j": 10}).feed(db.events())
    assert ledger.jobs["j"].state == "running on 2 node(s), 3 layer(s) frozen"
    _done(db, "j", "j-1", 2, launched=0.0, ended=50.0, train_s=40.0, steps=10)
    _launch(db, "j", "j-2", 1)
    ledger = RunLedger({"j": 10}).feed(db.events())
    assert ledger.jobs["j"].state == "running on 1 node(s)"
    assert [d.get("freeze") for _, k, d in db.events("launch")] == [3, None]


def test_a_job_submitted_but_not_yet_added_by_the_loop_shows_from_the_next_turn(tmp_path):
    """live_progress() reads the inbox's jobs (any thread may submit); orch.jobs is the loop's and gets a job at
    the loop's next turn. Between the two the bars raised KeyError and the run ended with it (the replay's smoke
    run, where the submit now comes while the workers start)."""
    out = io.StringIO()
    orch = _orch(tmp_path)
    orch.live_progress = lambda: {"ok": 1000, "late": 0}
    with LiveBars(Console(file=io.StringIO(), force_terminal=False), every_s=0, plain_to=out) as bars:
        bars(orch)
        assert [line.split()[2] for line in out.getvalue().splitlines()[1:]] == ["ok:"]
        orch.jobs["late"] = SimpleNamespace(samples=1000, global_batch=10)
        bars(orch)
        assert "late: 0.0% of 1,000 samples" in out.getvalue()
