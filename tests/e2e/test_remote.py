"""Remote submission through Globus Compute (parsl_bft.remote): the cloud service is stood in for at the SDK's
Executor boundary (tests/globus_standin.py); everything else - the SDK's serialiser, the facility functions in
separate processes, the detached training session on the embedded default, HDF5 checkpoints - is real."""
import fcntl
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from parsl_bft.cli import main
from parsl_bft.errors import UsageError
from parsl_bft.remote import RemoteError, facility
from parsl_bft.remote.bundle import make_bundle
from parsl_bft.sites import SiteError, load_site

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
from globus_standin import ENDPOINT_ID, StandInEndpoint  # noqa: E402
from harness import wait_for  # noqa: E402

WORKFLOW = HERE / "data" / "remote" / "tiny_train.py"
STEPS = 40


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


SLURM_FACILITY = """name: ci-slurm
scheduler: slurm
partition: backfill          # tools/local-slurm.sh's preemptable partition
node: {cores: 4, gpus: 0, ranks_per_node: 1}
pilot_walltime: {min_minutes: 1, max_minutes: 3}
interchange_address: 127.0.0.1
worker_init: "export SLURM_CONF=/tmp/local-slurm/etc/slurm.conf"
holes: {poll_seconds: 1, max_pending_seconds: 20, notice_seconds: 20, max_pilots: 1}
"""


def sites(tmp_path, endpoint_id: str = ENDPOINT_ID, facility_site: str | None = None) -> Path:
    """The facility's own site file (default: the embedded default on a steady one-node trace) and the
    laptop's, which only names the endpoint and where runs live there."""
    trace = tmp_path / "steady.csv"
    trace.write_text("node,idle_start,idle_end\nn1,0,1000000\n")
    fac = tmp_path / "facility.yaml"
    fac.write_text(facility_site or f"name: fac\nscheduler: local\nnode: {{cores: 1}}\n"
                                    f"emulation: {{trace: {trace}, speedup: 1, notice_seconds: 2}}\n")
    laptop = tmp_path / "laptop.yaml"
    laptop.write_text(f"name: gc\nscheduler: local\nnode: {{cores: 1}}\nglobus_compute_endpoint: {endpoint_id}\n"
                      f"remote: {{site: {fac}, runs_dir: {tmp_path / 'runs'}}}\n")
    return laptop


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    """The stand-in endpoint, used for every laptop-side connection; afterwards no session is left running.
    One per test: its processes take the environment of the moment (a facility's SLURM_CONF, say)."""
    import parsl_bft.remote.client as client
    ep = StandInEndpoint()
    monkeypatch.setattr(client, "sdk_executor", ep.executor)
    monkeypatch.setenv("PARSL_BFT_HOME", str(tmp_path / "home"))
    yield ep
    for hold in tmp_path.glob("hold*"):
        hold.unlink()
    for d in (tmp_path / "runs").glob("*"):
        facility.cancel_run(str(tmp_path / "runs"), d.name)
        wait_for(lambda: not facility._alive(d), what=f"run {d.name} to stop")
    ep.close()


@pytest.mark.parametrize("field", ["partition: debug", "account: proj", "worker_init: 'module load x'",
                                   "checkpoint_dir: /scratch/x"])
def test_an_endpoint_site_refuses_what_belongs_to_the_facility(tmp_path, field, capsys):
    p = tmp_path / "gc.yaml"
    p.write_text(f"name: gc\nscheduler: slurm\nnode: {{cores: 4}}\nglobus_compute_endpoint: {ENDPOINT_ID}\n{field}\n")
    with pytest.raises(SiteError, match=f"Globus Compute site does not use {field.split(':')[0]}: the facility"):
        load_site(p)
    assert main(["sites", "validate", str(p)]) == 1
    assert "does not use" in capsys.readouterr().err
    p.write_text("name: x\nscheduler: local\nnode: {cores: 1}\nremote: {runs_dir: /tmp}\n")
    with pytest.raises(SiteError, match="'remote' is only for a site with 'globus_compute_endpoint'"):
        load_site(p)
    p.write_text(f"name: gc\nscheduler: local\nnode: {{cores: 1}}\nglobus_compute_endpoint: {ENDPOINT_ID}\n"
                 "remote: {site: sites/a.yaml}\n")
    with pytest.raises(SiteError, match=r"field 'remote.site': a path at the facility: absolute or from the home"):
        load_site(p)


def test_the_bundle_ships_the_model_file_the_workflow_names(tmp_path):
    b = make_bundle(WORKFLOW, ["40", "x"])
    assert b.workflow == "tiny_train.py" and sorted(b.files) == ["tiny_model.py", "tiny_train.py"]
    assert b.run_id("s") == make_bundle(WORKFLOW, ["40", "x"]).run_id("s") \
        != make_bundle(WORKFLOW, ["41", "x"]).run_id("s")
    assert make_bundle(WORKFLOW, [40, Path("x")]).run_id("s") == b.run_id("s")     # the Python API's args: argv
    (tmp_path / "x.py").write_text("")
    (tmp_path / "wf").mkdir()
    (tmp_path / "wf" / "w.py").write_text(f"open('{tmp_path / 'x.py'}'); open('../x.py')\n")   # not its folder's
    assert sorted(make_bundle(tmp_path / "wf" / "w.py").files) == ["w.py"]
    with pytest.raises(UsageError, match="must be in its folder"):
        make_bundle(tmp_path / "wf" / "w.py", extra=[tmp_path / "x.py"])


def test_a_data_set_the_workflow_names_is_refused_before_it_is_read(tmp_path):
    """A workflow naming its (laptop-side copy of the) data: the bundle read the whole file into memory and only
    then found it too big (a 1 GiB file: 1 GiB of memory; a data set: the laptop's memory). Now its size is
    checked first, and the message names it. The file here is sparse: no disk is used."""
    from parsl_bft.remote.bundle import MAX_BYTES
    (tmp_path / "w.py").write_text("DATA = 'data/train.bin'\n")
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "train.bin", "wb") as f:
        f.truncate(MAX_BYTES * 170)
    with pytest.raises(UsageError, match=r"with data/train\.bin \(1020\.0 MiB\): put data at the facility"):
        make_bundle(tmp_path / "w.py")


def test_not_logged_in_is_a_clear_error_and_no_prompt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLOBUS_COMPUTE_USER_DIR", str(tmp_path / "gc"))      # no stored tokens
    monkeypatch.delenv("GLOBUS_COMPUTE_CLIENT_ID", raising=False)
    monkeypatch.delenv("GLOBUS_COMPUTE_CLIENT_SECRET", raising=False)
    monkeypatch.setenv("PARSL_BFT_HOME", str(tmp_path / "home"))
    code, out, err = cli(capsys, "submit", WORKFLOW, "--site", sites(tmp_path), "40", "x")
    assert code == 2 and out == "" and "not logged in to Globus Compute: set GLOBUS_COMPUTE_CLIENT_ID" in err
    local = tmp_path / "local.yaml"
    local.write_text("name: l\nscheduler: local\nnode: {cores: 1}\n")
    code, _, err = cli(capsys, "submit", WORKFLOW, "--site", local)        # refused before any login is tried
    assert code == 2 and "names no globus_compute_endpoint" in err
    code, _, err = cli(capsys, "submit", WORKFLOW, "--site", sites(tmp_path), "--run-id", "../up")
    assert code == 2 and "run id '../up': use 1-100 letters" in err
    code, _, err = cli(capsys, "submit", WORKFLOW, "--site", sites(tmp_path), "40", "--run", "../up")
    assert code == 2 and "not logged in" in err         # the workflow's own --run: no abbreviation of --run-id
    assert not (tmp_path / "home").exists()
    assert not (tmp_path / "gc").exists()                # nothing written where the SDK keeps its tokens


def test_unknown_or_offline_endpoint(tmp_path, endpoint, capsys):
    code, _, err = cli(capsys, "submit", WORKFLOW, "--site", sites(tmp_path, "0b1d0000-0000-4000-8000-000000000000"))
    assert code == 2 and "endpoint 0b1d0000-0000-4000-8000-000000000000: unknown, or not shared with you" in err
    endpoint.status = "offline"
    code, _, err = cli(capsys, "submit", WORKFLOW, "--site", sites(tmp_path))
    assert code == 2 and f"endpoint {ENDPOINT_ID} is offline: start it at the facility" in err
    assert endpoint.tasks == 0                          # nothing was sent to an endpoint that cannot take it


def test_facility_functions_refuse_and_report(tmp_path):
    runs = str(tmp_path / "runs")
    assert facility.call("status", runs, "nope") == {"error": f"no run nope under {runs} at the facility"}
    assert "run id '../x'" in facility.call("status", runs, "../x")["error"]
    d = tmp_path / "runs" / "r1"
    (d / "work").mkdir(parents=True)
    (d / "request.json").write_text('{"digest": "a"}')
    assert facility.run_status(runs, "r1")["state"] == "lost"          # started once, ended without a word
    (d / "exit.json").write_text('{"code": 1}')
    assert facility.run_status(runs, "r1")["state"] == "failed"
    assert "already names a different submission" in facility.call("start", runs, "r1", {}, {"digest": "b"})["error"]
    assert "no checkpoint of job 'x'" in facility.call("chunk", runs, "r1", "bft-state/a", "x", 0)["error"]
    assert "must be a relative path" in facility.call("start", runs, "r2", {"../evil.py": b""},
                                                      {"digest": "c", "workflow": "w.py"})["error"]
    assert not (tmp_path / "runs" / "r2" / "request.json").exists()


def _live_session(tmp_path, run_id: str = "r1") -> tuple[str, Path, int]:
    """A submitted run whose session is alive: this process holds its lock, as a runner does."""
    d = tmp_path / "runs" / run_id
    (d / "work").mkdir(parents=True)
    (d / "work" / "w.py").write_text("")
    (d / "request.json").write_text('{"digest": "a", "workflow": "w.py"}')
    fd = os.open(d / "session.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return str(tmp_path / "runs"), d, fd


def test_a_live_session_is_starting_until_a_job_launches_a_fragment(tmp_path):
    """For the ~40 s after submit (workflow importing, workers warming) status said "running" of a session
    that had no job yet; it says "starting" until a job has launched its first fragment."""
    from parsl_bft.execution.jobstore import JobStore
    runs, d, fd = _live_session(tmp_path)
    assert facility.run_status(runs, "r1")["state"] == "starting"
    state = d / "work" / "bft-state"
    state.mkdir()
    db = JobStore(state / "state.sqlite")
    db.add("a", {"samples": 70})
    assert facility.run_status(runs, "r1")["state"] == "starting"        # a job row waiting for its nodes
    db.update("a", status="running", size=1)
    assert facility.run_status(runs, "r1")["state"] == "running"
    db.update("a", status="waiting", fragments=1)                         # between fragments: still running
    assert facility.run_status(runs, "r1")["state"] == "running"
    db.close()
    os.close(fd)
    assert facility.run_status(runs, "r1")["state"] == "lost"


@pytest.mark.parametrize("call", ["status", "start"])
def test_a_session_ending_during_a_call_is_not_lost_nor_started_again(tmp_path, monkeypatch, call):
    """The session writes exit.json, then lets go of its lock. A call that read exit.json (not there yet) and
    then found the lock free said "lost" of a finished run (failing every future waiting on it), and a submit
    started the finished run again. Here the session ends exactly after the call's first read of exit.json."""
    runs, d, fd = _live_session(tmp_path)
    read = facility._read_json

    def session_ends_after_this_read(path):
        out = read(path)
        if path.name == "exit.json" and not (d / "exit.json").exists():
            (d / "exit.json").write_text('{"code": 0}')
            os.close(fd)
        return out
    monkeypatch.setattr(facility, "_read_json", session_ends_after_this_read)
    monkeypatch.setattr(facility, "_spawn", lambda d: pytest.fail("a second session was started"))
    if call == "status":
        assert facility.run_status(runs, "r1")["state"] == "starting"    # alive when the lock was tested; no job yet
    else:
        assert facility.start_run(runs, "r1", {"w.py": b""}, {"digest": "a", "workflow": "w.py"})["started"] is False


def test_cancel_signals_only_a_session_on_this_host(tmp_path, monkeypatch):
    """runner.json's pid means something only on the host that wrote it (runs_dir on a file system several
    login nodes share): elsewhere cancel signalled whatever process has that pid there."""
    runs, d, fd = _live_session(tmp_path)
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    (d / "runner.json").write_text(json.dumps({"pid": 4242, "host": "login-elsewhere"}))
    err = facility.call("cancel", runs, "r1")["error"]
    assert "runs on login-elsewhere" in err and "cancel it through an endpoint there" in err
    assert sent == [] and facility.run_status(runs, "r1")["state"] == "starting"
    (d / "runner.json").write_text(json.dumps({"pid": 4242, "host": socket.gethostname()}))
    assert facility.call("cancel", runs, "r1")["ok"]["state"] == "cancelling"
    assert sent == [(4242, signal.SIGTERM)]
    os.close(fd)


def test_a_run_resumed_in_the_same_session_is_waited_for_again(tmp_path, monkeypatch):
    """Cancel, then submit again through the same RemoteSession: ``run.result()`` / ``run.job()`` answered at
    once with the cancelled session's end. Futures of the Python API are bookkeeping on the laptop: the
    executor here is a thread pool calling the facility functions in this process, whose ``_spawn`` starts a
    "session" that is this process holding the run's lock."""
    from concurrent.futures import ThreadPoolExecutor

    from parsl_bft.remote.bundle import Bundle
    from parsl_bft.remote.client import RemoteSession
    held = []

    def spawn(d):
        held.append(os.open(d / "session.lock", os.O_RDWR | os.O_CREAT))
        fcntl.flock(held[-1], fcntl.LOCK_EX)
    monkeypatch.setattr(facility, "_spawn", spawn)
    d = tmp_path / "runs" / "r1"

    def session_ends(code: int) -> None:
        (d / "exit.json").write_text(json.dumps({"code": code}))
        os.close(held.pop())
    remote = RemoteSession(load_site(sites(tmp_path)), ThreadPoolExecutor(1), poll_s=0.05)
    bundle = Bundle("w.py", {"w.py": b""}, ())
    run = remote.submit_bundle(bundle, "r1")
    cancelled_job = run.job("a")
    remote.run("r1").cancel()
    session_ends(130)
    assert run.result(timeout=60)["state"] == "cancelled" and isinstance(cancelled_job.exception(), RemoteError)
    assert remote.submit_bundle(bundle, "r1").last["started"]
    job, done = run.job("a"), run.done()
    assert not job.done() and not done.done() and run.status()["state"] == "starting"
    session_ends(0)
    assert done.result(timeout=60)["state"] == "finished" and isinstance(job.exception(timeout=60), RemoteError)
    remote.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_closing_a_session_does_not_wait_for_a_busy_endpoint(tmp_path, endpoint):
    """A poll sent while the endpoint cannot answer (offline, or its workers busy: tasks queue at the service)
    kept ``close()`` - the end of ``with remote_session(...)`` - waiting until it was answered (up to
    call_timeout_s, 10 min). Here the endpoint's one worker is busy until the test lets it go."""
    import subprocess

    from parsl_bft.remote import remote_session
    hold = tmp_path / "hold-endpoint"
    hold.touch()
    busy = endpoint.pool.submit(subprocess.run, ["sh", "-c", f"while [ -e {hold} ]; do sleep 0.05; done"])
    with remote_session(sites(tmp_path), poll_s=0.05) as remote:
        waiting = remote.run("r1").done()
        wait_for(lambda: endpoint.tasks > 0, what="a poll sent to the endpoint")
    assert isinstance(waiting.exception(), RemoteError) and not busy.done()
    hold.unlink()
    busy.result()


@pytest.mark.slow
def test_submits_from_several_shells_at_once_keep_every_run(tmp_path, monkeypatch):
    """remote-runs.json is read, changed and replaced by each submit: at once, they lost each other's runs
    and crashed on each other's temporary file (after the run had started)."""
    import subprocess

    from parsl_bft.remote.registry import known_runs
    monkeypatch.setenv("PARSL_BFT_HOME", str(tmp_path / "home"))
    code = ("import sys\nfrom parsl_bft.remote.registry import remember\n"
            "for i in range(150):\n    remember(f'r{sys.argv[1]}-{i}', sys.argv[2])\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k), str(tmp_path / "s.yaml")]) for k in range(4)]
    assert [p.wait() for p in procs] == [0] * 4 and len(known_runs()) == 600


def test_checkpoints_leave_in_chunks_and_only_recorded_ones(tmp_path):
    """A final checkpoint bigger than one chunk comes back whole; the calls read no file a job did not record."""
    import hashlib

    from parsl_bft.execution.jobstore import JobStore
    runs = str(tmp_path / "runs")
    state = tmp_path / "runs" / "r1" / "work" / "bft-state" / "x"
    (state / "jobs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "request.json").write_text('{"digest": "a"}')
    (tmp_path / "runs" / "r1" / "exit.json").write_text('{"code": 0}')
    data = HDF5 + os.urandom(facility.CHUNK + 12345)        # the facility sends only what looks like HDF5
    (state / "jobs" / "a" / "ckpt-000000007.h5").write_bytes(data)
    db = JobStore(state / "state.sqlite")
    db.add("a", {"samples": 70})
    db.update("a", status="done", samples_done=70, checkpoint="jobs/a/ckpt-000000007.h5")
    db.close()
    st = facility.call("status", runs, "r1")["ok"]
    assert st["state"] == "finished" and st["jobs"] == [
        {"state": "bft-state/x", "job": "a", "status": "done", "samples_done": 70, "samples": 70, "nodes": 0,
         "fragments": 0, "checkpoint": str(state / "jobs" / "a" / "ckpt-000000007.h5")}]
    info = facility.call("digest", runs, "r1", "bft-state/x", "a")["ok"]
    assert info["size"] == len(data) and info["sha256"] == hashlib.sha256(data).hexdigest()
    got = b""
    while len(got) < info["size"]:
        got += facility.call("chunk", runs, "r1", "bft-state/x", "a", len(got))["ok"]
    assert got == data
    assert "no checkpoint of job 'a'" in facility.call("chunk", runs, "r1", "..", "a", 0)["error"]


HDF5 = b"\x89HDF\r\n\x1a\n"


def text_of(checkpoint: Path) -> str:
    """What _ended_run wrote after the HDF5 signature."""
    return checkpoint.read_bytes()[len(HDF5):].decode()


def _ended_run(tmp_path, exit_code: int, states: dict) -> None:
    """Run r1's folder under tmp_path/runs as its ended session leaves it: per state directory (relative to the
    run's work/), its one job "a" as (status, samples, samples_done, the checkpoint file's text)."""
    from parsl_bft.execution.jobstore import JobStore
    run = tmp_path / "runs" / "r1"
    (run / "work").mkdir(parents=True)
    (run / "request.json").write_text('{"digest": "a"}')
    (run / "exit.json").write_text(json.dumps({"code": exit_code}))
    for rel, (status, samples, done, text) in states.items():
        state = run / "work" / rel
        (state / "jobs" / "a").mkdir(parents=True)
        ckpt = f"jobs/a/ckpt-{done:09d}.h5"
        (state / ckpt).write_bytes(HDF5 + text.encode())
        db = JobStore(state / "state.sqlite")
        db.add("a", {"samples": samples})
        db.update("a", status=status, samples_done=done, checkpoint=ckpt)
        db.close()


def test_fetch_keeps_same_named_jobs_of_same_named_state_dirs_apart(tmp_path):
    """Two sessions of one workflow in exp1/bft-state and exp2/bft-state, each with a job "a": both final
    checkpoints were copied to bft-state-a.h5, the second over the first. And --out naming a file raised a
    FileExistsError. The executor is a thread pool calling the facility functions here (what is tested is the
    laptop's side)."""
    from concurrent.futures import ThreadPoolExecutor

    from parsl_bft.remote.client import RemoteSession
    _ended_run(tmp_path, 0, {f"{exp}/bft-state": ("done", 1, 1, exp) for exp in ("exp1", "exp2")})
    remote = RemoteSession(load_site(sites(tmp_path)), ThreadPoolExecutor(1))
    got = remote.run("r1").fetch(tmp_path / "got")
    assert sorted(text_of(p) for p in got.values()) == ["exp1", "exp2"]
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == sorted(p.name for p in got.values())
    (tmp_path / "a-file").touch()                  # --out naming a file: a message, not a FileExistsError
    with pytest.raises(RemoteError, match=r"cannot use .*a-file as the folder for the checkpoints: File exists"):
        remote.run("r1").fetch(tmp_path / "a-file")
    remote.close()


def test_fetch_takes_the_newest_checkpoint_of_an_unfinished_job_and_no_name_leaves_out(tmp_path):
    """A cancelled run's job has no final checkpoint, but its newest one is what a scientist wants back; and a
    job name in the endpoint's answer is a file name here: '../../x' must not write outside --out."""
    from concurrent.futures import ThreadPoolExecutor

    from parsl_bft.remote.client import RemoteSession
    _ended_run(tmp_path, 130, {"bft-state": ("waiting", 100, 7, "step 7")})
    remote = RemoteSession(load_site(sites(tmp_path)), ThreadPoolExecutor(1))
    got = remote.run("r1").fetch(tmp_path / "got")
    assert {k: text_of(p) for k, p in got.items()} == {"a": "step 7"}
    hostile = remote.run("r1")
    hostile.status = lambda: {"jobs": [{"job": "../../x", "state": "bft-state", "status": "done",
                                        "checkpoint": "/etc/passwd"}]}
    with pytest.raises(RemoteError, match=r"a job.s name is .../../x., not a plain name"):
        hostile.fetch(tmp_path / "got")
    assert not (tmp_path / "x.h5").exists()
    remote.close()


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):
    """The workflow's job trained here, as one fragment: what a remote run of it must give back bit for bit."""
    from parsl_bft.execution.apps import fragment_task
    from parsl_bft.train.checkpoint import load_checkpoint
    from parsl_bft.train.config import FragmentConfig
    d = tmp_path_factory.mktemp("local")
    res = fragment_task(FragmentConfig(job="tiny", workload=f"{WORKFLOW.parent / 'tiny_model.py'}:Tiny",
                                       checkpoint_dir=str(d), global_batch=32, total_samples=32 * STEPS,
                                       workload_args={"hold": str(d / "hold")}, fsync=False))
    return load_checkpoint(res.checkpoint)


def assert_same_model(path: Path, ref) -> None:
    from parsl_bft.train.checkpoint import load_checkpoint
    got = load_checkpoint(path)
    assert got.step == ref.step == STEPS and got.model.keys() == ref.model.keys()
    assert all(got.model[k].equal(ref.model[k]) for k in ref.model)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_submit_watch_cancel_resume_fetch_equals_a_local_run(tmp_path, endpoint, local_model, capsys, monkeypatch):
    """From the laptop's CLI, each command a fresh connection (the laptop may have gone away in between):
    submit -> status while it trains -> cancel (it checkpoints) -> submit again: it resumes from that checkpoint
    and finishes -> fetch --checkpoint: the model equals one fragment of the same job run here."""
    from parsl_bft.execution.jobstore import JobStore
    from parsl_bft.remote import remote_session

    laptop = sites(tmp_path)
    hold = tmp_path / "hold"
    hold.touch()                                      # training waits before step 6 while this exists
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")   # the endpoint worker's own GPU: not the pilots'
    code, out, err = cli(capsys, "submit", WORKFLOW, "--site", laptop, STEPS, hold)
    run_id = out.strip()
    assert code == 0 and run_id.startswith("tiny_train-") and "started" in err
    state = tmp_path / "runs" / run_id / "work" / "bft-state" / "tiny"
    wait_for(Path(f"{hold}.held").exists, what="training to start")
    code, out, _ = cli(capsys, "status", run_id)           # a run id from this laptop: no --site needed
    assert code == 0 and f"run {run_id}: running" in out.splitlines()[0]

    with remote_session(laptop, poll_s=0.2) as remote:    # the laptop goes away while a future waits ...
        waiting = remote.run(run_id).job("tiny")
    assert isinstance(waiting.exception(timeout=60), RemoteError)    # ... which fails it, not the run

    code, _, err = cli(capsys, "cancel", run_id)
    assert code == 0 and f"run {run_id}: cancelling" in err
    wait_for((state / "jobs" / "tiny" / "STOP").exists, what="the session to ask its fragment to stop")
    hold.unlink()
    with remote_session(laptop, poll_s=0.2) as remote:    # the Python API: futures resolved by polling
        st = remote.run(run_id).result(timeout=300)
    saved = st["jobs"][0]["samples_done"] // 32
    assert st["state"] == "cancelled" and 0 < saved < STEPS

    code, out, err = cli(capsys, "submit", WORKFLOW, "--site", laptop, STEPS, hold)   # resume
    assert code == 0 and out.strip() == run_id and "started" in err
    # the same again: no second session
    code, out, err = cli(capsys, "submit", WORKFLOW, "--site", laptop, STEPS, hold)
    assert code == 0 and out.strip() == run_id and "already submitted" in err
    with remote_session(laptop, poll_s=0.2) as remote:
        run = remote.run(run_id)
        assert run.job("tiny").result(timeout=300) == str(state / "jobs" / "tiny" / f"ckpt-{STEPS:09d}.h5")
        assert run.result(timeout=300)["state"] == "finished"
    db = JobStore(state / "state.sqlite", readonly=True)
    assert [d["resume_step"] for _, _, d in db.events("launch")] == [0, saved]     # resumed, not restarted

    code, out, _ = cli(capsys, "fetch", run_id, "--checkpoint", "--out", tmp_path / "got")
    assert code == 0 and out.split() == ["tiny", str(tmp_path / "got" / "tiny.h5")]
    code, out, _ = cli(capsys, "logs", run_id)
    assert out.count("=== session") == 2 and "final checkpoint:" in out
    assert "not passed on to pilots (the endpoint worker's own accelerator pinning): CUDA_VISIBLE_DEVICES" in out
    ranks = [p.read_text() for p in (state / "jobs" / "tiny" / "logs").glob("*.log")]
    assert ranks and all("CUDA_VISIBLE_DEVICES=None" in r for r in ranks)

    assert_same_model(tmp_path / "got" / "tiny.h5", local_model)
    for d in (tmp_path / "runs").glob("*/runner.json"):          # every session ended by itself
        assert not facility._alive(d.parent)
    assert os.path.exists(tmp_path / "runs" / run_id / "exit.json")


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_run_submitted_to_the_local_slurm_trains_on_a_pilot(slurm, tmp_path, endpoint, local_model, capsys):
    """The same workflow with the facility's site file on the real local Slurm: the detached session starts a
    pilot from the endpoint's side, the job trains there, the fetched model equals the local one, and no pilot
    is left."""
    from parsl_bft.execution.jobstore import JobStore
    from parsl_bft.remote import remote_session

    laptop = sites(tmp_path, facility_site=SLURM_FACILITY.replace("/tmp/local-slurm/etc/slurm.conf",
                                                                  os.environ["SLURM_CONF"]))   # the fixture's
    code, out, _ = cli(capsys, "submit", WORKFLOW, "--site", laptop, STEPS, tmp_path / "hold")
    run_id = out.strip()
    with remote_session(laptop, poll_s=0.5) as remote:
        assert remote.run(run_id).result(timeout=300)["state"] == "finished"
    code, out, _ = cli(capsys, "fetch", run_id, "--checkpoint", "--out", tmp_path / "got")
    assert code == 0
    assert_same_model(tmp_path / "got" / "tiny.h5", local_model)
    db = JobStore(tmp_path / "runs" / run_id / "work" / "bft-state" / "tiny" / "state.sqlite", readonly=True)
    assert all(n.startswith("n") for _, _, d in db.events("launch") for n in d["nodes"])   # a Slurm node
    wait_for(lambda: not [j for j in slurm.queue() if j.state in ("RUNNING", "PENDING")], what="the pilots to end")


@pytest.mark.slow
def test_the_runner_runs_a_workflow_as_parsl_bft_run_does(tmp_path, capsys, monkeypatch):
    """The detached session runs the request through run_workflow (no CLI): the workflow's arguments, and the
    messages and exit codes `parsl-bft run` gives for a bad site file, a missing workflow and a deliberate error."""
    import warnings

    from parsl_bft.remote.runner import run
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)     # run() sets the CLI's
    w = tmp_path / "w.py"
    w.write_text("import sys\nfrom parsl_bft.errors import BadValue\nprint('args', sys.argv[1:])\n"
                 "if sys.argv[1:] == ['fail']:\n    raise BadValue('bad\\n  value')\n"
                 "if sys.argv[1:] == ['bug']:\n    raise ValueError('a bug')\n")
    assert run({"workflow": str(w), "args": ["a", "--b"]}) == 0
    assert "args ['a', '--b']" in capsys.readouterr().out
    assert run({"workflow": str(w), "args": ["fail"]}) == 2
    assert capsys.readouterr().err.strip() == "parsl-bft run: error: bad value"
    with pytest.raises(ValueError, match="a bug"):            # not a deliberate error: main() logs its traceback
        run({"workflow": str(w), "args": ["bug"]})
    assert run({"workflow": str(w), "args": [], "site": str(tmp_path / "nope.yaml")}) == 2
    assert capsys.readouterr().err.strip() == f"parsl-bft run: error: {tmp_path / 'nope.yaml'}: no such site file"
    assert run({"workflow": str(tmp_path / "gone.py"), "args": []}) == 2
    assert capsys.readouterr().err.strip() == f"parsl-bft run: error: no such workflow file: {tmp_path / 'gone.py'}"
