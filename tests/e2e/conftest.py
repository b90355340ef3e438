"""End-to-end tests: real Parsl executors, real torch.distributed ranks, real Slurm. Each test that needs one is
marked slow where it is defined (a module's ``pytestmark`` where every test of the module does, a decorator
otherwise); a test marked ``slurm`` counts as slow too (tests/conftest.py). A test here that needs none of them
runs in the inner loop (pytest -m "not slow and not slurm")."""
import os
import subprocess

import pytest

from parsl_bft.execution.slurm import SlurmCommands

from paths import ROOT


@pytest.fixture(scope="module")
def local_slurm():
    """The local Slurm of tools/local-slurm.sh, at $SLURM_LOCAL_BASE (default /tmp/local-slurm) on
    $SLURM_LOCAL_PORT (default 16817): two clusters on one machine (two worktrees' tests) need a base and ports
    each."""
    if os.geteuid() != 0:
        pytest.fail("the slurm tests need root to install and start a local Slurm (CI runs as root)")
    base = os.environ.get("SLURM_LOCAL_BASE", "/tmp/local-slurm")
    env = {**os.environ, "SLURM_LOCAL_FRESH": "1", "SLURM_LOCAL_AUTH": "none", "SLURM_LOCAL_BASE": base,
           "SLURM_LOCAL_PORT": os.environ.get("SLURM_LOCAL_PORT", "16817")}
    r = subprocess.run([str(ROOT / "tools" / "local-slurm.sh"), "restart"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    os.environ["SLURM_CONF"] = f"{base}/etc/slurm.conf"
    yield SlurmCommands()
    subprocess.run(["scancel", "--user", "root"], capture_output=True)


@pytest.fixture
def slurm(local_slurm):
    """The module's local Slurm, its queue emptied after each test: a failed test's jobs (pilots, the facility
    jobs it made) held nodes the next test counted on, and that test failed too."""
    yield local_slurm
    subprocess.run(["scancel", "--user", "root"], capture_output=True)
    from harness import wait_for
    wait_for(lambda: not [j for j in local_slurm.queue() if j.state in ("PENDING", "RUNNING", "COMPLETING")], 120,
             what="an empty queue after the test")
