"""The pilot node's rank server (train/rank_server.py): started in front of a command (as a pilot's worker pool
starts), it imports nothing from the folder it starts in, starts the launcher's children with multiprocessing's
exit codes, tells a child whose launcher has gone to stop and kills it after its grace, outlives the scheduler's
TERM so that the ranks it started can save, goes with the command (its children with it, after their grace),
serves its own user only, and a launcher whose server has gone starts ranks from its own forkserver."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsl_bft.train import launcher
from parsl_bft.train.rank_client import ENV, RankServerGone, ServedProcess
from parsl_bft.train.rank_server import LAUNCH

from harness import alive, children_of, cmdline_of, environ_of, parent_of, wait_for


def _launch(grace_s: int) -> list[str]:
    """The pilot's launch command (LAUNCH) with this Python and a grace of ``grace_s``."""
    _, *rest = LAUNCH.split()
    assert rest[-1] == "--"
    return [sys.executable, *rest[:-1], "--grace", str(grace_s), "--"]


# a rank's ways with TERM (the notice), run by ``exec`` in a child once it has written ``{mark}.ready``: it saves
# and exits 0 (``mark`` written once the path ``until`` has gone: "" at once), or it goes on regardless
SAVES = ("import os, signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})\n"
         "open({mark!r} + '.ready', 'w').close()\nsignal.sigwait({{signal.SIGTERM}})\n"
         "while os.path.exists({until!r}): time.sleep(0.05)\nopen({mark!r}, 'w').close()\n")
DEAF = ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen({mark!r} + '.ready', 'w').close()\n"
        "while True: signal.pause()\n")


def _code(code: str, mark: Path, until: str = "") -> str:
    """SAVES or DEAF for ``mark`` (and ``until``)."""
    return code.format(mark=str(mark), until=until)


def _started(address: str, code: str, mark: Path, until: str = "") -> ServedProcess:
    """A child running ``code`` (SAVES or DEAF) once it is ready for TERM."""
    p = ServedProcess(address, exec, (_code(code, mark, until), {}))
    wait_for(lambda: Path(f"{mark}.ready").exists(), timeout=60, what=f"the child {p.pid} to be ready")
    return p


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A folder anyone may write (as /tmp), holding a ``parsl_bft`` and a ``torch`` package that leave a mark
    when imported (as in test_safe_path.py): where the server starts. Returns (folder, mark)."""
    root = tmp_path_factory.mktemp("planted")
    shared, mark = root / "shared", root / "imported"
    shared.mkdir()
    shared.chmod(0o1777)
    for pkg in ("parsl_bft", "torch"):
        (shared / pkg).mkdir()
        (shared / pkg / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write({pkg!r} + '\\n')\n")
    return shared, mark


@pytest.fixture(scope="module")
def served(planted):
    """A command (sleep) with a rank server in front of it, as a pilot's worker pool runs, started in the
    planted folder: (its process, the server's address, the server's pid)."""
    proc = subprocess.Popen([*_launch(3), "sleep", "600"], cwd=planted[0])
    try:
        address = wait_for(lambda: environ_of(proc.pid).get(ENV) if proc.poll() is None else None, timeout=60,
                           what="the command to run with the server's address")
        (server,) = wait_for(lambda: children_of(proc.pid), timeout=60, what="the rank server to be forked")
        yield proc, address, server
    finally:
        proc.kill()
        proc.wait()


def test_the_command_keeps_its_pid_and_learns_where_the_server_is(served):
    proc, address, server = served
    assert Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0")[:2] == ["sleep", "600"]     # exec'd in place
    assert address.startswith("@parsl-bft-ranks-")           # abstract: nothing on disk to leave behind
    assert "rank_server" in cmdline_of(server)


def test_it_imports_nothing_from_the_folder_it_starts_in(served, planted):
    """The pilot's folder may be shared: the server imports parsl_bft and torch there before it serves (-P)."""
    _, address, _ = served
    child = ServedProcess(address, sys.exit, (0,))         # answered once the server has imported everything
    child.join()
    assert child.exitcode == 0
    assert not planted[1].exists(), planted[1].read_text()


def test_children_exit_as_multiprocessing_children_do(served):
    _, address, server = served
    codes = {}
    for arg, want in ((3, 3), (None, 0), ("a message", 1)):
        p = ServedProcess(address, sys.exit, (arg,))
        assert parent_of(p.pid) == server
        p.join()
        codes[arg] = (p.exitcode, want)
    assert all(got == want for got, want in codes.values()), codes
    p = ServedProcess(address, time.sleep, (600,))
    assert p.exitcode is None
    os.kill(p.pid, signal.SIGTERM)
    wait_for(lambda: p.exitcode is not None, timeout=60, what="the exit code of a child ended by SIGTERM")
    assert p.exitcode == -signal.SIGTERM


def test_a_child_whose_launcher_has_gone_is_told_to_stop_then_killed(served, tmp_path):
    """Told as a rank is (TERM: it saves at the end of its step); one that does not go is killed 3 s later."""
    _, address, _ = served
    mark = tmp_path / "saved"
    saving, deaf = _started(address, SAVES, mark), _started(address, DEAF, tmp_path / "deaf")
    pids = [saving.pid, deaf.pid]
    assert all(alive(p) for p in pids)
    del saving, deaf                           # their connections close, as when the worker dies
    wait_for(lambda: not any(alive(p) for p in pids), timeout=60, what="the server to end both children")
    assert mark.exists()


def test_the_launcher_starts_ranks_there_and_falls_back_when_it_has_gone(served, monkeypatch, capfd):
    _, address, server = served
    monkeypatch.setitem(launcher._SERVED, "address", address)
    p = launcher._started(time.sleep, (600,))
    try:
        assert isinstance(p, ServedProcess) and parent_of(p.pid) == server
    finally:
        p.kill() if hasattr(p, "kill") else os.kill(p.pid, signal.SIGKILL)
    monkeypatch.setitem(launcher._SERVED, "address", "@parsl-bft-ranks-nobody-listens")
    assert launcher._run_child(sys.exit, 4) == 4            # from this process's own forkserver
    assert launcher._SERVED["address"] == ""                 # not asked again
    assert "ranks start from this worker's own forkserver" in capfd.readouterr().err


def test_the_workers_own_forkserver_outlives_term_too_and_its_children_take_it(monkeypatch, tmp_path):
    """The fallback: TERM to the forkserver (as to the pilot's group) leaves it standing, and a child takes TERM
    as its notice (it saves and exits 0)."""
    monkeypatch.setitem(launcher._SERVED, "address", "")
    mark = tmp_path / "saved"
    p = launcher._started(exec, (_code(SAVES, mark), {}))
    wait_for(lambda: Path(f"{mark}.ready").exists(), timeout=120, what="the forkserver's child to be ready")
    forkserver = parent_of(p.pid)
    assert forkserver and "forkserver" in cmdline_of(forkserver)
    os.kill(forkserver, signal.SIGTERM)
    os.kill(p.pid, signal.SIGTERM)
    assert launcher._join(p) == 0 and mark.exists()
    assert alive(forkserver)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user (CI runs as root)")
def test_another_user_is_refused(served):
    _, address, _ = served
    probe = ("import os, pickle, sys, time\nfrom parsl_bft.train.rank_client import ServedProcess, RankServerGone\n"
             "os.setgid(65534); os.setuid(65534)\n"     # imported first: nobody cannot read this Python's files
             f"try:\n    ServedProcess({address!r}, time.sleep, (600,))\nexcept RankServerGone:\n    sys.exit(7)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                       cwd="/", env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 7, r.stderr


@pytest.mark.slow       # a server of its own: torch imported once more
def test_the_server_outlives_the_schedulers_term_so_its_children_save_and_goes_with_the_command(tmp_path):
    """TERM to the pilot's process group (the scheduler ending it): the command (the pool) dies of it, the server
    does not. Its children stop as ranks do: one saves (its save lasts until the command has gone) and exits 0;
    one that goes on is killed after the grace (2 s); then the server goes."""
    proc = subprocess.Popen([*_launch(2), "sleep", "600"], start_new_session=True)
    try:
        address = wait_for(lambda: environ_of(proc.pid).get(ENV), timeout=60, what="the command to start")
        (server,) = wait_for(lambda: children_of(proc.pid), timeout=60, what="the rank server to be forked")
        mark = tmp_path / "saved"
        saving = _started(address, SAVES, mark, until=f"/proc/{proc.pid}")    # gone once the test reaps it
        deaf = _started(address, DEAF, tmp_path / "deaf")
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        saving.join()
        assert saving.exitcode == 0 and mark.exists()
        deaf.join()
        assert deaf.exitcode == -signal.SIGKILL
        wait_for(lambda: not alive(server), timeout=60, what="the server to go once its children have")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_server_that_is_gone_says_so():
    with pytest.raises(RankServerGone, match="nobody"):
        ServedProcess("@parsl-bft-ranks-nobody", sys.exit, (0,))
