"""Measured cost models: the costs file, its loader's errors, and what a replay charges under one."""
import json
import re

import pytest

from parsl_bft.errors import InputError
from parsl_bft.idle.intervals import IdleIntervals
from parsl_bft.jobs import JobSet, JobSpec
from parsl_bft.planner import Planner
from parsl_bft.save_interval import PRIOR_MTBF_NODE_S, mtbf_node_s, young_interval
from parsl_bft.scaling import ScalingCurve
from parsl_bft.sim import simulate
from parsl_bft.sim.costs import SHIPPED, Cause, CostsError, cost_model, load_costs

LINEAR = ScalingCurve("lin", {1: 100.0, 2: 200.0, 4: 400.0})
HEADER = "model,restart_s,save_s,stall_s,warmup_s,notice_preemption\n"


def costs(tmp_path, row="lin,3,1,0,0,1", header=HEADER):
    p = tmp_path / "x.costs.csv"
    p.write_text(header + row + "\n")
    return p


def reclaim_at_100():
    # 2 nodes idle from 0; n1 is reclaimed at 100; the replay ends at 200 (as test_sim's t_down test)
    iv = IdleIntervals.build(["n0", "n1"], [0, 1], [0, 0], [200, 100], t0=0, t1=200)
    js = JobSet([JobSpec("a", "lin", 1, 4, 10.0, 5.0, 1e9, 0.0)], {"lin": LINEAR})
    return iv, js


def test_a_reclaim_with_notice_costs_the_measured_restart(tmp_path):
    iv, js = reclaim_at_100()
    m = simulate(iv, js, Planner(method="dp", t_fwd=100), costs=load_costs(costs(tmp_path))).metrics()
    # the job saves ahead and restarts: 3 s at 200/s (not BFTrainer's t_down of 5 s)
    assert m["reclaim_loss"] == pytest.approx(600)
    assert m["samples"] == pytest.approx(20000 - 600 + 10000)
    assert m["cost_model"] == "x.costs.csv"
    assert simulate(iv, js, Planner(method="dp", t_fwd=100)).metrics()["cost_model"] == "bftrainer"


def test_a_reclaim_without_notice_loses_the_work_since_the_last_save(tmp_path):
    iv, js = reclaim_at_100()
    m = simulate(iv, js, Planner(method="dp", t_fwd=100),
                 costs=load_costs(costs(tmp_path, "lin,3,1,0,0,0"))).metrics()
    # the runtime's own interval for 2 nodes after 200 node-s trained; half of it lost, the restart without its save
    tau = young_interval(1.0, mtbf_node_s(200.0, 0.0, PRIOR_MTBF_NODE_S), 2)
    assert m["reclaim_loss"] == pytest.approx(600 + 200 * (tau / 2 - 1))


def test_periodic_saves_stall_training_and_are_counted(tmp_path):
    iv = IdleIntervals.build(["n0"], [0], [0], [100], t0=0, t1=100)
    js = JobSet([JobSpec("a", "lin", 1, 4, 10.0, 5.0, 1e9, 0.0)], {"lin": LINEAR})
    m = simulate(iv, js, Planner(method="dp", t_fwd=100), costs=load_costs(costs(tmp_path, "lin,3,1,0.5,0,1"))
                 ).metrics()
    assert 0 < m["save_loss"] < 100 * 100 * 0.5 / 5
    assert m["samples"] + m["save_loss"] == pytest.approx(100 * 100)


def test_resizes_cost_the_restart_and_its_warm_up(tmp_path):
    js = JobSet([JobSpec("a", "lin", 1, 4, 10.0, 5.0, 1e9, 0.0)], {"lin": LINEAR})
    got = load_costs(costs(tmp_path, "lin,3,1,0,0.5,1")).applied(js).jobs[0]
    assert (got.t_up, got.t_down) == (3.5, 3.5)


@pytest.mark.parametrize("row,header,what", [
    ("lin,3,1", "model,restart_s,save_s\n", "missing column(s) stall_s"),
    ("lin,3,1,0,0,1.5", HEADER, "field 'notice_preemption' a share: must be <= 1"),
    ("lin,-3,1,0,0,1", HEADER, "field 'restart_s' must be >= 0"),
    ("lin,x,1,0,0,1", HEADER, "field 'restart_s' not a number"),
    ("lin,3,1,0,0,1\nlin,3,1,0,0,1", HEADER, "'lin' has a row already"),
    ("", HEADER, "no rows"),
])
def test_a_bad_costs_file_is_one_line_naming_where(tmp_path, row, header, what):
    with pytest.raises(InputError, match=re.escape(what)) as e:
        load_costs(costs(tmp_path, row, header))
    assert "\n" not in str(e.value) and "x.costs.csv" in str(e.value)


def test_gpu_benchmark_rows_load_with_every_reclaim_announced(tmp_path):
    # benchmarks/gpu.py's gpu.costs.csv columns: no warm-up and no notice columns
    p = costs(tmp_path, "resnet50,NVIDIA H100,6.1,1.2,2.0,0.4,1.9,0.2",
              "model,device,restart_s,launch_s,restore_s,first_step_s,save_s,stall_s\n")
    r = load_costs(p).row("resnet50")
    assert (r.restart_s, r.save_s, r.stall_s, r.device) == (6.1, 1.9, 0.2, "NVIDIA H100")
    assert r.notice == {c: 1.0 for c in Cause}


def test_the_shipped_file_covers_the_workloads_and_the_imagenet_mix(shared_data):
    from parsl_bft.jobs import load_jobset
    model = cost_model("measured")
    assert model is not None and SHIPPED.name == model.name
    model.check(load_jobset(shared_data / "jobs" / "imagenet_mix.jobs.csv"))
    assert not model.row("images").estimate and model.row("vgg16").estimate
    assert cost_model("bftrainer") is None
    with pytest.raises(CostsError, match="no row for model 'nope'"):
        model.row("nope")


def test_cli_simulate_costs(tmp_path, capsys):
    from parsl_bft.cli import main
    (tmp_path / "s.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\n"
                                         "a,lin,1,8,1,1,1e9,0\n")
    (tmp_path / "s.scaling.csv").write_text("model,nodes,samples_per_sec\nlin,1,10\nlin,8,70\n")
    (tmp_path / "idle.csv").write_text("node,idle_start,idle_end\nn0,0,300\nn1,0,200\nn2,100,300\n")
    base = ["simulate", "--idle-intervals", str(tmp_path / "idle.csv"), "--jobs", str(tmp_path / "s.jobs.csv"),
            "--no-ceiling", "--no-mask", "--json", str(tmp_path / "r.json")]
    assert main([*base, "--costs", str(costs(tmp_path))]) == 0
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["cost_model"] == "x.costs.csv" and got["config"]["costs"] == "x.costs.csv"
    capsys.readouterr()
    assert main([*base, "--costs", str(costs(tmp_path, "other,3,1,0,0,1"))]) == 2
    err = capsys.readouterr().err
    assert "no row for model(s) lin" in err and len(err.strip().splitlines()) == 1


def test_the_runtime_and_the_simulator_share_one_save_interval():
    from parsl_bft.execution.checkpoint_policy import CheckpointPolicy
    p = CheckpointPolicy()
    p.observe_save(2.0)
    p.observe_training(3600.0, lost_without_notice=True)
    assert p.interval(4) == young_interval(2.0, mtbf_node_s(3600.0, 1), 4)
    assert p.interval(4, hole_left_s=20.0) == 10.0      # half of a known hole's time left
