"""A real Slurm with a two-switch tree: the topology is read live, the plan puts a 2-node job in one switch, and
the job runs there. The cluster is a private one (its own base directory and ports), so the shared local
cluster other tests use is never restarted."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from parsl_bft.jobs import JobSpec
from parsl_bft.planner import JobState, place
from parsl_bft.planner.topo_placement import BcoPlacement
from parsl_bft.scaling import ScalingCurve
from parsl_bft.topology import slurm_topology

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.timeout(400)
def test_a_two_rank_job_planned_in_one_switch_runs_there(cluster, monkeypatch, tmp_path):
    """The runtime path on real pilots: the pool learns the switches from Slurm, aims pilots at the holes (n1 in
    s0; n5, n6 in s1) with one executor per switch; the site's planner puts a 2-rank job in s1 and a 1-rank job
    on n1; the fragments' ranks report where they ran. An executor for all pilots would put the 2-rank job's
    ranks on n5 and n6 only one time in three."""
    import parsl

    from parsl_bft.execution.config import ensure_venv_on_path
    from parsl_bft.execution.htex import SiteRunner
    from parsl_bft.execution.pool import SitePool
    from parsl_bft.execution.session import make_planner, make_pool
    from parsl_bft.execution.site_runtime import build_config
    from parsl_bft.sites import Site
    from parsl_bft.train.config import FragmentConfig
    from parsl_bft.train.launcher import serve_store
    from parsl_bft.train.protocol import JobDir

    from harness import wait_for

    monkeypatch.setenv("SLURM_CONF", cluster["SLURM_CONF"])
    ensure_venv_on_path()
    blockers = [subprocess.run(["sbatch", "--parsable", "-p", "debug", "-w", w, "-N", n, "-o", "/dev/null", "--wrap",
                                "sleep 600"], env=cluster, capture_output=True, text=True, check=True).stdout.strip()
                for w, n in (("n[2-4]", "3"), ("n[7-8]", "2"))]
    site = Site(name="topo-slurm", scheduler="slurm", partition="backfill", interchange_address="127.0.0.1",
                node={"cores": 4, "gpus": 0, "ranks_per_node": 1}, pilot_walltime={"min_minutes": 1, "max_minutes": 3},
                worker_init=f"export SLURM_CONF={cluster['SLURM_CONF']}",
                holes={"poll_seconds": 1, "max_pending_seconds": 60, "notice_seconds": 20, "max_pilots": 3})
    config = build_config(site)
    config.run_dir = str(tmp_path / "runinfo")
    label = config.executors[0].label
    try:
        wait_for(lambda: subprocess.run(["squeue", "-h", "-t", "R", "-j", ",".join(blockers)], env=cluster,
                                        capture_output=True, text=True).stdout.count("\n") == 2, 60, 0.5)
        with parsl.load(config) as dfk:
            pool = make_pool(site, dfk.executors[label])
            assert pool.topology.by_group(["n1", "n5", "n6"]) == {"s0": ["n1"], "s1": ["n5", "n6"]}
            pool.demand = 3
            pool.start()
            joined: set[str] = set()
            try:
                wait_for(lambda: joined.update(n for e in pool.poll() if e.kind == "join" for n in e.nodes)
                         or joined == {"n1", "n5", "n6"}, 180, 0.5)          # pilots on n1, n5, n6
                lanes = {n: pool.executor_label(n) for n in joined}
                assert lanes["n5"] == lanes["n6"] != lanes["n1"], lanes
                lane = {dfk.executors[lanes[n]] for n in joined} - {dfk.executors[label]}
                (pid,) = [ex.interchange_proc.pid for ex in lane]       # a Ctrl-C does not reach its interchange
                sigblk = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigBlk"))
                assert int(sigblk.split()[1], 16) & (1 << (signal.SIGINT - 1)), sigblk
                pair = JobState(JobSpec("pair", "m", 2, 2, 0.0, 0.0, 64.0, 0.0), ScalingCurve("m", {1: 1.0, 2: 2.0}))
                solo = JobState(JobSpec("solo", "m", 1, 1, 0.0, 0.0, 64.0, 0.0), ScalingCurve("m", {1: 1.0}))
                plan = make_planner(site, pool.topology).plan([pair, solo], ["n5", "n1", "n6"])
                assert sorted(plan.allocation["pair"]) == ["n5", "n6"] and plan.allocation["solo"] == ("n1",)
                runner = SiteRunner("", SitePool(pool, label), serve_store(""))
                handles = {}
                for name in ("solo", "pair"):      # solo first: a blind executor would be free to pick n5 for it
                    jd = JobDir(tmp_path / name)
                    jd.own("g1")
                    nodes = plan.allocation[name]
                    cfg = FragmentConfig(job=name, workload="images", checkpoint_dir=str(jd.path),
                                         world_size=len(nodes), global_batch=32, total_samples=64,
                                         workload_args={"n": 64}, generation="g1", timeout_s=60.0,
                                         fragment_id=f"{name}-f1")
                    handles[name] = runner.launch(cfg, nodes)
                wait_for(lambda: all(h.done() for h in handles.values()), 240, 0.5)
                for h in handles.values():
                    assert h.result().samples_done >= 64
                assert sorted(runner.placed("pair-f1", 2).values()) == ["n5", "n6"]
                assert runner.placed("solo-f1", 1) == {0: "n1"}
            finally:
                pool.stop()
    finally:
        subprocess.run(["scancel", *blockers], env=cluster, capture_output=True)
