"""Every Python process parsl-bft starts imports nothing from the folder it starts in: a ``parsl_bft/`` package
another user planted in a shared folder (a group project folder, /tmp) the run was started from never runs."""
import ast
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from parsl_bft.execution.config import interchange_dies_with_us
from parsl_bft.safe_python import OURS_ENV, SAFE_PATH_ENV, forget_safe_path_env, safe_path_env

ROOT = Path(__file__).resolve().parents[2] / "parsl_bft"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A folder anyone may write (as /tmp), holding a ``parsl_bft`` and a ``torch`` package that leave a mark
    when imported; the test's working folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777 | stat.S_ISVTX)
    mark = tmp_path / "imported"
    for pkg in ("parsl_bft", "torch"):
        (shared / pkg).mkdir()
        (shared / pkg / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write({pkg!r} + '\\n')\n")
    monkeypatch.chdir(shared)
    return mark


def test_the_rendezvous_store_imports_nothing_from_the_working_folder(planted):
    from parsl_bft.train.launcher import RendezvousStore
    store = RendezvousStore()
    try:
        store.set("k", "v")                   # it serves: its process started with the real packages
        assert store.get("k") == b"v"
    finally:
        store.close()
    assert not planted.exists(), planted.read_text()


def test_the_interchange_watcher_imports_nothing_from_the_working_folder(planted):
    argv = interchange_dies_with_us()
    assert argv[1] == "-P" and argv[-1].endswith("interchange.py")
    r = subprocess.run([*argv[:-1], "true"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not planted.exists(), planted.read_text()


def test_a_local_endpoint_worker_imports_nothing_from_the_working_folder(planted):
    from parsl_bft.execution.globus import LocalEndpointExecutor, TaskProcesses
    ex = LocalEndpointExecutor(pool=TaskProcesses())
    assert ex.submit(len, [1, 2, 3]).result(timeout=300) == 3
    assert not planted.exists(), planted.read_text()


def test_the_safe_path_variable_is_ours_only_while_starting(monkeypatch):
    """The rank forkserver starts under safe_path_env() and forgets it (rank_preload): the user's own scripts,
    run from a rank, keep their folder on sys.path."""
    monkeypatch.delenv(SAFE_PATH_ENV, raising=False)
    with safe_path_env():
        assert os.environ[SAFE_PATH_ENV] == "1"
        forget_safe_path_env()              # what the forkserver does in its own environment
        assert SAFE_PATH_ENV not in os.environ
    assert SAFE_PATH_ENV not in os.environ and OURS_ENV not in os.environ
    monkeypatch.setenv(SAFE_PATH_ENV, "1")  # the user's own setting is left alone
    with safe_path_env():
        forget_safe_path_env()
    assert os.environ[SAFE_PATH_ENV] == "1"


def test_the_rank_forkserver_imports_nothing_from_the_working_folder(planted):
    """The forkserver starts as ``python -c`` in the worker's folder and imports parsl_bft (torch too). Its
    parent here has no -P (a Parsl worker has none): it imports first, then moves to the shared folder."""
    code = ("import os; from parsl_bft.train.launcher import start_rank_server; os.chdir('shared'); "
            "start_rank_server()")
    r = subprocess.run([sys.executable, "-c", code], cwd=planted.parent, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert not planted.exists(), planted.read_text()


def test_every_python_process_is_started_through_safe_python():
    """``sys.executable`` on a command line anywhere else would start without -P."""
    uses = []
    for p in ROOT.rglob("*.py"):
        if p.name == "safe_python.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "executable" \
                    and getattr(node.value, "id", "") == "sys":
                uses.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    # config.py: the folder of this Python (PATH, interchange.py beside it); facility.py: an error message
    allowed = {"execution/config.py", "remote/facility.py"}
    assert [u for u in uses if u.split(":")[0] not in allowed] == []

