"""What parsl-bft trusts on a shared login node or project folder, and from the endpoint: only directories of the
user's own that nobody else can write (state directories, a site's checkpoint_dir, a remote run's folder), no
symbolic link followed inside them, checkpoints namespaced by the run, and every value of the endpoint's answers
checked before the laptop uses it."""
import json
import os
import stat
from concurrent.futures import Future
from pathlib import Path

import pytest

from parsl_bft.execution.errors import StateError
from parsl_bft.execution.statedir import StateDir, lock_state_dir
from parsl_bft.jobs import check_job_name
from parsl_bft.remote import facility

NOBODY = 65534


def as_nobody(path: Path) -> None:
    """``path`` given to another user (nobody), as a fellow user of a shared login node would have made it."""
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user (os.chown); CI runs as root: run it there")
    os.chown(path, NOBODY, NOBODY)


# --- job names -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a\n", "../x", "", "a/b", ".a", "x" * 129, None, 3])
def test_a_job_name_is_one_plain_path_component(name):
    with pytest.raises(ValueError, match="use 1-128 letters"):
        check_job_name(name)
    assert check_job_name("cnn-small_2.v1") == "cnn-small_2.v1"


def test_check_job_name_lives_where_no_torch_is_imported():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys; from parsl_bft.jobs import check_job_name; "
                          "from parsl_bft.remote import answers; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- checkpoint directories ----------------------------------------------------------------------------------
def test_job_folders_in_a_checkpoint_dir_belong_to_one_run(tmp_path):
    """A site's checkpoint_dir held <job>/ folders by name: a new run, or another workflow with a job of the same
    name, resumed someone else's checkpoints. Now each run has its folder there; a restart finds its own."""
    ckpt = tmp_path / "ckpt"
    one = StateDir(tmp_path / "wf1")
    root = one.jobs_root("s", ckpt)
    assert root.parent == ckpt and root.name.startswith("wf1-") and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert StateDir(tmp_path / "wf1").jobs_root("s", ckpt) == root           # a restart: the same folder
    assert StateDir(tmp_path / "wf2").jobs_root("s", ckpt) != root            # another workflow
    (tmp_path / "wf1").rename(tmp_path / "wf1.old")                          # what --new-run does
    assert StateDir(tmp_path / "wf1").jobs_root("s", ckpt) != root
    assert StateDir(tmp_path / "x").jobs_root("", None) == tmp_path / "x" / "jobs"      # no checkpoint_dir: as ever


def test_a_copied_state_directory_never_shares_the_originals_checkpoint_folder(tmp_path):
    """A copy kept the run id, so both used one folder in the checkpoint_dir: starting the copy fenced the
    original's fragments there (its job failed as stale). A copy is refused before it touches anything; the
    original goes on; a directory moved away from its old place (none left there) keeps its id and folder."""
    import shutil
    ckpt = tmp_path / "ckpt"
    root = StateDir(tmp_path / "a").jobs_root("s", ckpt)
    (root / "img").mkdir()
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    with pytest.raises(StateError, match=r"state directory .*copy is a copy of .*/a: its run id \(a-[0-9a-f]{12}\) "
                                         r"names that directory's checkpoints.*--new-run"):
        StateDir(tmp_path / "copy").jobs_root("s", ckpt)
    assert sorted(p.name for p in root.iterdir()) == ["img"]
    assert StateDir(tmp_path / "a").jobs_root("s", ckpt) == root               # the original: as before
    shutil.copytree(tmp_path / "a", tmp_path / "other-fs")                    # a move across file systems
    shutil.rmtree(tmp_path / "a")
    assert StateDir(tmp_path / "other-fs").jobs_root("s", ckpt) == root
    (tmp_path / "other-fs").rename(tmp_path / "renamed")                      # a move on one file system
    assert StateDir(tmp_path / "renamed").jobs_root("s", ckpt) == root
    assert (tmp_path / "renamed" / "run-id.home").read_text() == f"{tmp_path / 'renamed'}\n"


def test_a_checkpoint_dir_must_be_private(tmp_path):
    ckpt = tmp_path / "open"
    ckpt.mkdir()
    ckpt.chmod(0o777)
    with pytest.raises(StateError, match=rf"checkpoint directory {ckpt} is writable by others \(mode 777\): chmod"):
        StateDir(tmp_path / "s").jobs_root("", ckpt)
    ckpt.chmod(0o755)                                # readable by others is fine: nobody else can write
    state = StateDir(tmp_path / "s")
    run = ckpt / state.run_id()
    victim = tmp_path / "victim"
    victim.mkdir()
    run.symlink_to(victim)                           # this run's folder prepared as a link
    with pytest.raises(StateError, match=rf"checkpoint directory {run} is a symbolic link"):
        state.jobs_root("", ckpt)
    assert list(victim.iterdir()) == []


def test_a_run_id_file_is_never_followed(tmp_path):
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_text("mine-0123456789ab\n")
    (d / "run-id").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateError, match="run-id is a symbolic link"):
        StateDir(d).run_id()
    (d / "run-id").unlink()
    (d / "run-id").write_text("../../etc\n")
    with pytest.raises(StateError, match="holds no run id"):
        StateDir(d).run_id()


def test_a_session_refuses_a_bad_checkpoint_dir_before_any_pilot_starts(tmp_path):
    from parsl_bft.execution.session import check_checkpoint_dirs
    from parsl_bft.execution.site_runtime import SiteRuntime
    from parsl_bft.sites import Site
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    ckpt.chmod(0o775)                                # a group-writable project folder
    rt = SiteRuntime.of(Site(name="s", scheduler="local", node={"cores": 1}, checkpoint_dir=str(ckpt)))
    with pytest.raises(StateError, match="writable by others"):
        check_checkpoint_dirs(tmp_path / "state", [rt])


# --- a remote run's folder -----------------------------------------------------------------------------------
REQUEST = {"workflow": "wf.py", "args": [], "site": None, "digest": "d1"}


def test_a_run_folder_prepared_by_others_is_refused(tmp_path):
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1").chmod(0o777)
    out = facility.call("start", str(runs), "r1", {"wf.py": b"print(1)\n"}, REQUEST)
    assert "run folder" in out["error"] and "writable by others (mode 777)" in out["error"]
    (runs / "r1").chmod(0o700)
    (runs / "r1" / "request.json").write_text(json.dumps(REQUEST))
    (runs / "r1").chmod(0o770)
    assert "writable by others" in facility.call("status", str(runs), "r1")["error"]


def test_a_link_under_the_work_folder_never_makes_a_submit_write_elsewhere(tmp_path):
    """A pre-created link inside the run's work folder made a submit overwrite an unrelated file."""
    runs, victim = tmp_path / "runs", tmp_path / "victim.py"
    victim.write_text("precious")
    work = runs / "r1" / "work"
    work.mkdir(parents=True, mode=0o700)
    (work / "wf.py").symlink_to(victim)
    out = facility.call("start", str(runs), "r1", {"wf.py": b"print(1)\n"}, REQUEST)
    assert "wf.py is a symbolic link" in out["error"] and victim.read_text() == "precious"
    (work / "wf.py").unlink()
    (work / "pkg").symlink_to(tmp_path)              # a folder on the way
    out = facility.call("start", str(runs), "r1", {"wf.py": b"", "pkg/victim.py": b"x"}, REQUEST)
    assert "pkg is a symbolic link" in out["error"] and victim.read_text() == "precious"
    (work / "pkg").unlink()
    (runs / "r1" / "request.json").symlink_to(victim)
    out = facility.call("start", str(runs), "r1", {"wf.py": b""}, REQUEST)
    assert "error" in out and victim.read_text() == "precious"


def test_a_run_id_with_a_trailing_newline_is_refused():
    with pytest.raises(facility.FacilityError, match="run id"):
        facility.check_run_id("r1\n")


# --- another user's directories (a shared login node) --------------------------------------------------------
def test_directories_another_user_prepared_are_refused(tmp_path):
    """As nobody (the other user) prepares them: a state directory, a checkpoint_dir and a remote run's folder,
    each 0700 (so only its mode would not tell). Each is refused naming the path, nothing in them is used."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    as_nobody(state)
    with pytest.raises(StateError, match=rf"state directory {state} belongs to another user \(uid {NOBODY}\)"):
        lock_state_dir(state)
    assert not (state / "orchestrator.lock").exists()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    as_nobody(ckpt)
    with pytest.raises(StateError, match=rf"checkpoint directory {ckpt} belongs to another user"):
        StateDir(tmp_path / "mine").jobs_root("", ckpt)
    runs = tmp_path / "runs"
    (runs / "r1" / "work").mkdir(parents=True, mode=0o700)
    (runs / "r1" / "request.json").write_text(json.dumps(REQUEST))
    (runs / "r1" / "runner.json").write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    as_nobody(runs / "r1")
    for op in ("start", "status", "cancel"):
        args = ({"wf.py": b""}, REQUEST) if op == "start" else ()
        out = facility.call(op, str(runs), "r1", *args)
        assert out == {"error": f"run folder {runs / 'r1'} belongs to another user (uid {NOBODY}): use a directory "
                                "of your own"}, op


# --- the endpoint's answers ----------------------------------------------------------------------------------
class Answering:
    """An executor whose every task answers ``value`` (what a broken or hostile endpoint might send)."""

    def __init__(self, value):
        self.value = value

    def submit(self, fn, *args):
        fut = Future()
        fut.set_result(self.value)
        return fut

    def shutdown(self, **kw):
        pass


GOOD_STATUS = {"run_id": "r1", "state": "finished", "exit_code": 0, "folder": "/x", "host": "h", "runner": None,
               "jobs": [{"state": "bft-state/wf", "job": "a", "status": "done", "samples_done": 1, "samples": 1,
                         "nodes": 0, "fragments": 1, "checkpoint": "/x/a.h5"}]}


def _with(**change):
    return {**GOOD_STATUS, **change}


def _job(**change):
    return _with(jobs=[{**GOOD_STATUS["jobs"][0], **change}])


@pytest.mark.parametrize("reply,expected", [
    (None, r"the reply is None, not"), ("ok", r"the reply is 'ok'"), ({"ok": None}, r"the answer is None"),
    ({"error": None}, r"the refusal is None"), ({"ok": 1, "error": "x"}, "the reply is"),
    ({"ok": _with(state="done")}, r"the run's state is 'done'"), ({"ok": _with(jobs="x")}, "jobs is 'x', not a list"),
    ({"ok": _with(exit_code="0")}, "exit_code is '0'"), ({"ok": _with(jobs=[None])}, "a job row is None"),
    ({"ok": _job(job="../../x")}, r"a job's name is '\.\./\.\./x'"), ({"ok": _job(job="a\n")}, "a job's name"),
    ({"ok": _job(state="/etc")}, "a state directory is '/etc'"), ({"ok": _job(state="a/../..")}, "state directory"),
    ({"ok": _job(samples_done=-1)}, "samples_done is -1"), ({"ok": _job(fragments=True)}, "fragments is True"),
    ({"ok": _job(checkpoint=7)}, "checkpoint is 7"), ({"ok": _job(status=None)}, "a job's status is None"),
])
def test_every_value_of_a_status_answer_is_checked(tmp_path, reply, expected):
    from parsl_bft.remote.client import RemoteError, RemoteSession
    from parsl_bft.sites import Site
    site = Site(name="gc", scheduler="local", node={"cores": 1}, globus_compute_endpoint="local")
    run = RemoteSession(site, Answering(reply)).run("r1")
    with pytest.raises(RemoteError, match=expected) as e:
        run.status()
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
    ok = RemoteSession(site, Answering({"ok": GOOD_STATUS})).run("r1")
    assert ok.status() == GOOD_STATUS


@pytest.mark.parametrize("op,args,reply,expected", [
    ("logs", (None,), {"ok": {"text": None, "offset": 0, "size": 0}}, "text is None"),
    ("logs", (None,), {"ok": {"text": "", "offset": "0", "size": 0}}, "offset is '0'"),
    ("digest", ("s", "a"), {"ok": {"path": "/x", "size": 3, "sha256": "zz"}}, "sha256 is 'zz'"),
    ("chunk", ("s", "a", 0), {"ok": "text"}, "the data is 'text'"),
    ("chunk", ("s", "a", 0), {"ok": b"x" * (facility.CHUNK + 1)}, "the data is '4194305 bytes'"),
    ("start", ({}, {}), {"ok": GOOD_STATUS}, "started is None"),
])
def test_every_other_answer_is_checked(op, args, reply, expected):
    from parsl_bft.remote.client import RemoteError, RemoteSession
    from parsl_bft.sites import Site
    site = Site(name="gc", scheduler="local", node={"cores": 1}, globus_compute_endpoint="local")
    with pytest.raises(RemoteError, match=expected):
        RemoteSession(site, Answering(reply)).call(op, "r1", *args)


@pytest.mark.parametrize("name", ["my state", "$(touch pwned)", "a;b", "it's", "`id`"])
def test_a_state_directory_path_that_a_shell_would_split_or_run_is_refused_at_start(tmp_path, monkeypatch, name):
    """Parsl puts the state directory's runinfo path into the worker pool's command unquoted: a space stalled
    the run for ever, a $(...) ran. Refused before anything is made or started, naming the characters."""
    from parsl_bft.execution.session import training_session
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StateError, match=r"its path holds .* which Parsl's worker and pilot commands would pass "
                                         r"to a shell unquoted"), training_session(tmp_path / name):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_status_shows_control_characters_and_markup_from_a_database_as_text(tmp_path, capsys):
    """An escape sequence in a job's error (a tampered or damaged database) reached the terminal: it could
    retitle, clear or rewrite it. Now written out; Rich markup in it is shown as typed, not applied."""
    from parsl_bft.cli import main
    from parsl_bft.execution import events
    from parsl_bft.execution.jobstore import JobStore
    db = JobStore(tmp_path / "state.sqlite")
    db.add("a", {"name": "a", "samples": 10})
    db.update("a", status="failed")
    db.record(events.Failed("a", "\x1b]0;pwned\x07\x1b[2Jboom [bold]x[/bold]"))
    db.close()
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "a failed: \\x1b]0;pwned\\x07\\x1b[2Jboom [bold]x[/bold]" in out


def test_status_of_a_failed_job_shows_what_was_kept_not_its_last_report(tmp_path, capsys, monkeypatch):
    """The failed fragment's last progress report (38.6%) was shown, not its newest checkpoint's (12.0%)."""
    import time

    from parsl_bft.cli import main
    from parsl_bft.execution import events
    from parsl_bft.execution.jobstore import JobStore
    from parsl_bft.train.protocol import JobDir, Progress
    monkeypatch.setenv("COLUMNS", "250")
    db = JobStore(tmp_path / "state.sqlite")
    for name in ("broken", "train"):
        db.add(name, {"name": name, "samples": 1000})
        JobDir(tmp_path / "jobs" / name).ensure().write_progress(Progress(13, 386, 0.25, 2, 10, time.time(),
                                                                          time.time()))
    db.update("broken", status="failed", samples_done=120)
    db.record(events.Failed("broken", "boom"))
    db.update("train", status="running", samples_done=120)
    db.close()
    assert main(["status", str(tmp_path)]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.split()[1:2]}
    assert "12.0% of 1,000" in rows["broken"] and "38.6% of 1,000" in rows["train"]


def test_fetch_at_the_facility_sends_only_a_jobs_own_checkpoint_file(tmp_path):
    """The checkpoint path comes from the run's database, which the workflow's code can write: a fetch copied
    any file the endpoint's user could read. Now only ckpt-<step>.h5 in the job's folder, HDF5, no link."""
    from parsl_bft.execution.jobstore import JobStore
    runs, secret = tmp_path / "runs", tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    state = runs / "r1" / "work" / "bft-state"
    (state / "jobs" / "a").mkdir(parents=True)
    (runs / "r1" / "request.json").write_text('{"digest": "a"}')
    (runs / "r1" / "exit.json").write_text('{"code": 0}')
    hdf5 = b"\x89HDF\r\n\x1a\n" + b"weights"
    (state / "jobs" / "a" / "ckpt-000000007.h5").write_bytes(hdf5)
    (state / "jobs" / "a" / "ckpt-000000008.h5").write_text("PRIVATE KEY")          # a copy under the name
    (state / "jobs" / "a" / "ckpt-000000009.h5").symlink_to(tmp_path / "elsewhere.h5")
    (tmp_path / "elsewhere.h5").write_bytes(hdf5)
    db = JobStore(state / "state.sqlite")
    db.add("a", {"samples": 70})
    for ckpt, words in ((str(secret), "is not ckpt-<step>.h5 in the job's folder"),
                        ("jobs/a/ckpt-000000008.h5", "is not an HDF5 file"),
                        ("jobs/a/ckpt-000000009.h5", "cannot be read: Too many levels of symbolic links")):
        db.update("a", status="done", samples_done=70, checkpoint=ckpt)
        for op, args in (("digest", ()), ("chunk", (0,))):
            out = facility.call(op, str(runs), "r1", "bft-state", "a", *args)
            assert words in out.get("error", ""), (ckpt, op, out)
    db.update("a", checkpoint="jobs/a/ckpt-000000007.h5")
    db.close()
    assert facility.call("chunk", str(runs), "r1", "bft-state", "a", 0)["ok"] == hdf5


def test_a_state_directory_that_cannot_be_used_is_one_line(tmp_path, monkeypatch, capsys):
    """A read-only, full or over-long state directory ended `parsl-bft run` with a Python traceback."""
    import errno
    import sqlite3

    from parsl_bft.cli import main
    from parsl_bft.execution import statedir
    from parsl_bft.execution.session import training_session
    with pytest.raises(StateError, match=r"state directory .*: cannot use it: its path is too long; give one"), \
            training_session(tmp_path / ("x" * 300)):
        pass

    def read_only(d):
        raise OSError(errno.EROFS, "Read-only file system", str(d / "orchestrator.lock"))
    monkeypatch.setattr(statedir, "lock_state_dir", read_only)
    with pytest.raises(StateError, match=r"state directory .*ro: cannot use it: it is on a read-only file system "
                                         r"\(.*orchestrator.lock\)"), training_session(tmp_path / "ro"):
        pass
    full = tmp_path / "full.py"          # mid-run, the database finds the disk full
    full.write_text("import sqlite3\nraise sqlite3.OperationalError('database or disk is full')\n")
    assert main(["run", str(full)]) == 2
    assert capsys.readouterr().err == ("parsl-bft run: error: database or disk is full (--debug shows where)\n")
    with pytest.raises(sqlite3.OperationalError):
        main(["run", "--debug", str(full)])
