"""A real Slurm with a two-switch tree: the topology is read live, the plan puts a 2-node job in one switch, and
the job runs there. The cluster is a private one (its own base directory and ports), so the shared local
cluster other tests use is never restarted."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from parsl_bft.jobs import JobSpec
from parsl_bft.planner import JobState, place
from parsl_bft.planner.topo_placement import BcoPlacement
from parsl_bft.scaling import ScalingCurve
from parsl_bft.topology import slurm_topology

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]
BASE = "/tmp/local-slurm-topology"


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.fail("the slurm tests need root to install and start a local Slurm (CI runs as root)")
    env = {**os.environ, "SLURM_LOCAL_BASE": BASE, "SLURM_LOCAL_PORT": "17917", "SLURM_LOCAL_AUTH": "none",
           "SLURM_LOCAL_SWITCHES": "2", "SLURM_LOCAL_FRESH": "1"}
    script = str(ROOT / "tools" / "local-slurm.sh")
    r = subprocess.run([script, "restart"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    env["SLURM_CONF"] = f"{BASE}/etc/slurm.conf"
    yield env
    subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
    subprocess.run([script, "clean"], env=env, capture_output=True)


def test_plan_puts_a_two_rank_job_in_one_switch_and_it_runs_there(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", cluster["SLURM_CONF"])
    topo = slurm_topology()
    assert topo.by_group([f"n{i}" for i in range(1, 9)]) == {"s0": ["n1", "n2", "n3", "n4"],
                                                              "s1": ["n5", "n6", "n7", "n8"]}
    # a facility job holds n1: switch s0 has 3 idle nodes, s1 has 4; the pool lists them interleaved, as a
    # topology-blind placement would take them
    blocker = subprocess.run(["sbatch", "--parsable", "-w", "n1", "-N1", "--wrap", "sleep 300"], env=cluster,
                             capture_output=True, text=True, check=True).stdout.strip()
    pool = ["n5", "n2", "n6", "n3", "n7", "n4", "n8"]
    job = JobState(JobSpec("j", "m", 2, 2, 0.0, 0.0, 1.0, 0.0), ScalingCurve("m", {1: 1.0, 2: 2.0}))
    nodes = place([job], {"j": 2}, pool, BcoPlacement(topo))["j"]
    assert topo.span(nodes) == 1 and topo.group(nodes[0]) == "s0"      # the tighter fit: small jobs fill fragments
    r = subprocess.run(["srun", "-N2", "-w", ",".join(nodes), "--time=1", "bash", "-c", "echo $SLURMD_NODENAME"],
                       env=cluster, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ran = sorted(r.stdout.split())
    assert ran == sorted(nodes) and {topo.group(n) for n in ran} == {"s0"}
    subprocess.run(["scancel", blocker], env=cluster, capture_output=True)
