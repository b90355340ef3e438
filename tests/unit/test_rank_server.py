"""The pilot node's rank server (train/rank_server.py): started in front of a command (as a pilot's worker pool
starts), it imports nothing from the folder it starts in, starts the launcher's children with multiprocessing's
exit codes, kills a child whose launcher has gone, dies with the command (its children with it), serves its own
user only, and a launcher whose server has gone starts ranks from its own forkserver."""
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

from harness import wait_for


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().partition("=")[::2] for kv in raw if b"=" in kv)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == pid]


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
    cmd = [*LAUNCH.replace("python3", sys.executable, 1).split(), "sleep", "600"]
    proc = subprocess.Popen(cmd, cwd=planted[0])
    try:
        address = wait_for(lambda: _environ(proc.pid).get(ENV) if proc.poll() is None else None, timeout=60,
                           what="the command to run with the server's address")
        (server,) = wait_for(lambda: _children(proc.pid), timeout=60, what="the rank server to be forked")
        yield proc, address, server
    finally:
        proc.kill()
        proc.wait()


def test_the_command_keeps_its_pid_and_learns_where_the_server_is(served):
    proc, address, server = served
    assert Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0")[:2] == ["sleep", "600"]     # exec'd in place
    assert address.startswith("@parsl-bft-ranks-")           # abstract: nothing on disk to leave behind
    assert "rank_server" in Path(f"/proc/{server}/cmdline").read_text()


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
        assert _parent(p.pid) == server
        p.join()
        codes[arg] = (p.exitcode, want)
    assert all(got == want for got, want in codes.values()), codes
    p = ServedProcess(address, time.sleep, (600,))
    assert p.exitcode is None
    os.kill(p.pid, signal.SIGTERM)
    wait_for(lambda: p.exitcode is not None, timeout=60, what="the exit code of a child ended by SIGTERM")
    assert p.exitcode == -signal.SIGTERM


def test_a_child_whose_launcher_has_gone_is_killed(served):
    _, address, _ = served
    p = ServedProcess(address, time.sleep, (600,))
    pid = p.pid
    assert _alive(pid)
    del p                                      # its connection closes, as when the worker dies
    wait_for(lambda: not _alive(pid), timeout=60, what="the server to kill the child of a closed connection")


def test_the_launcher_starts_ranks_there_and_falls_back_when_it_has_gone(served, monkeypatch, capfd):
    _, address, server = served
    monkeypatch.setitem(launcher._SERVED, "address", address)
    p = launcher._started(time.sleep, (600,))
    try:
        assert isinstance(p, ServedProcess) and _parent(p.pid) == server
    finally:
        p.kill() if hasattr(p, "kill") else os.kill(p.pid, signal.SIGKILL)
    monkeypatch.setitem(launcher._SERVED, "address", "@parsl-bft-ranks-nobody-listens")
    assert launcher._run_child(sys.exit, 4) == 4            # from this process's own forkserver
    assert launcher._SERVED["address"] == ""                 # not asked again
    assert "ranks start from this worker's own forkserver" in capfd.readouterr().err


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
def test_server_and_children_die_with_the_command():
    cmd = [*LAUNCH.replace("python3", sys.executable, 1).split(), "sleep", "600"]
    proc = subprocess.Popen(cmd)
    try:
        address = wait_for(lambda: _environ(proc.pid).get(ENV), timeout=60, what="the command to start")
        (server,) = wait_for(lambda: _children(proc.pid), timeout=60, what="the rank server to be forked")
        child = ServedProcess(address, time.sleep, (600,))
        proc.kill()
        proc.wait()
        wait_for(lambda: not _alive(server), timeout=60, what="the server to die with its command")
        wait_for(lambda: not _alive(child.pid), timeout=60, what="the server's child to die with it")
        assert child.exitcode == -signal.SIGKILL or child.exitcode is None or child.exitcode < 0
    finally:
        proc.kill()


def test_a_server_that_is_gone_says_so():
    with pytest.raises(RankServerGone, match="nobody"):
        ServedProcess("@parsl-bft-ranks-nobody", sys.exit, (0,))
