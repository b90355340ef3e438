import json
import subprocess
import sys

import pytest

from parsl_bft.idle.intervals import IdleIntervals
from parsl_bft.jobs import JobSet, JobSpec, load_jobset
from parsl_bft.planner import Planner
from parsl_bft.scaling import ScalingCurve
from parsl_bft.sim import simulate

LINEAR = ScalingCurve("lin", {1: 100.0, 2: 200.0, 4: 400.0})


def jobset(*jobs):
    return JobSet(list(jobs), {"lin": LINEAR})


def job(name="a", samples=1e9, t_up=10.0, t_down=5.0, submit=0.0, lo=1, hi=4):
    return JobSpec(name, "lin", lo, hi, t_up, t_down, samples, submit)


def test_reclaim_costs_t_down_at_the_current_rate():
    # 2 nodes idle from 0; n1 is reclaimed at 100; the replay ends at 200
    iv = IdleIntervals.build(["n0", "n1"], [0, 1], [0, 0], [200, 100], t0=0, t1=200)
    res = simulate(iv, jobset(job()), Planner(method="dp", t_fwd=100))
    m = res.metrics()
    # 0..100 on 2 nodes: 20,000; reclaim: 5 s * 200/s = 1,000 lost; 100..200 on 1 node: 10,000
    assert m["reclaim_loss"] == pytest.approx(1000)
    assert m["samples"] == pytest.approx(29000)
    assert m["idle_node_s"] == pytest.approx(300) and m["allocated_node_s"] == pytest.approx(300)
    assert m["e_idle"] == pytest.approx(290 / 300)
    assert res.jobs[0].reclaims == 1


def test_rescale_costs_t_up_at_the_current_rate():
    iv = IdleIntervals.build(["n0", "n1"], [0, 1], [0, 50], [200, 200], t0=0, t1=200)
    res = simulate(iv, jobset(job()), Planner(method="dp", t_fwd=100))
    m = res.metrics()
    # 0..50 on 1 node: 5,000; grow at 50: 10 s * 100/s lost; 50..200 on 2 nodes: 30,000
    assert m["rescale_loss"] == pytest.approx(1000)
    assert m["samples"] == pytest.approx(34000)
    assert m["e_used"] == pytest.approx(340 / (50 + 300))


def test_finished_jobs_free_nodes_for_the_next():
    iv = IdleIntervals.build(["n0"], [0], [0], [1000], t0=0, t1=1000)
    res = simulate(iv, jobset(job("a", samples=10000), job("b", samples=1e9, submit=1)),
                   Planner(method="dp", t_fwd=100), max_concurrent=1)
    rows = {r["name"]: r for r in res.job_rows()}
    assert rows["a"]["finished_at"] == pytest.approx(100)
    assert rows["b"]["admitted_at"] == pytest.approx(100)
    assert rows["b"]["samples_done"] == pytest.approx(900 * 100)
    assert res.metrics()["jobs_finished"] == 1


def test_job_below_min_nodes_after_a_reclaim_stops():
    iv = IdleIntervals.build(["n0", "n1"], [0, 1], [0, 0], [200, 100], t0=0, t1=200)
    res = simulate(iv, jobset(job(lo=2, hi=2)), Planner(method="dp", t_fwd=100))
    m = res.metrics()
    assert m["samples"] == pytest.approx(20000 - 1000)
    assert m["allocated_node_s"] == pytest.approx(200)      # n0 sits idle after the reclaim: nobody fits


@pytest.fixture(scope="module")
def summit(shared_data):
    from parsl_bft.idle.intervals import read_idle_intervals
    return read_idle_intervals(shared_data / "eval" / "summit_256n_24h_idle_intervals.csv.gz")


@pytest.fixture(scope="module")
def imagenet(shared_data):
    return load_jobset(shared_data / "jobs" / "imagenet_mix.jobs.csv")


@pytest.mark.parametrize("method", ["dp", "equal-share", "greedy", pytest.param("milp", marks=pytest.mark.slow)])
def test_conservation_on_a_real_trace(summit, imagenet, method):
    res = simulate(summit, imagenet, Planner(method=method, objective="speedup"), duration=4 * 3600)
    tl = res.timeline
    for idle, by in zip(tl.idle, tl.held):
        assert sum(by.values()) <= idle                   # never more nodes allocated than idle
    m = res.metrics()
    assert m["allocated_node_s"] <= m["idle_node_s"] + 1e-6
    assert 0 < m["e_idle"] <= m["e_used"] <= 1.0
    for r in res.job_rows():
        assert 0 <= r["samples_done"] <= r["samples"]


def test_replay_is_deterministic(summit, imagenet):
    a = simulate(summit, imagenet, Planner(method="dp"), duration=3 * 3600).as_dict()
    b = simulate(summit, imagenet, Planner(method="dp"), duration=3 * 3600).as_dict()
    for d in (a, b):
        d.pop("solve_p50_s"), d.pop("solve_p99_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_milp_beats_equal_share_with_speedup(summit, imagenet):
    ms = simulate(summit, imagenet, Planner(method="dp", objective="speedup"), duration=12 * 3600).metrics()
    eq = simulate(summit, imagenet, Planner(method="equal-share"), duration=12 * 3600).metrics()
    assert ms["e_idle"] > eq["e_idle"] and ms["rescale_loss"] < eq["rescale_loss"]


def test_cli_simulate_json_and_plot(tmp_path, shared_data):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    r = subprocess.run([sys.executable, "-m", "parsl_bft.cli", "simulate", "--idle-intervals",
                        str(shared_data / "eval" / "summit_256n_24h_idle_intervals.csv.gz"),
                        "--jobs", str(shared_data / "jobs" / "imagenet_mix.jobs.csv"), "--planner", "dp",
                        "--duration", "2h", "--nodes", "128", "--json", str(out), "--plot", str(png)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    for k in ("e_idle", "e_used", "util", "samples", "rescale_loss", "reclaim_loss", "jobs_finished", "events",
              "solve_p50_s", "solve_p99_s", "jobs"):
        assert k in d
    assert d["config"]["nodes"] == 128 and d["span_s"] == pytest.approx(7200)
    assert png.stat().st_size > 10_000


def test_controller_books_follow_where_the_executor_put_ranks():
    from parsl_bft.control import Controller
    specs = [JobSpec("a", "a", 1, 2, 0, 0, 1e9, 0), JobSpec("b", "b", 1, 2, 0, 0, 1e9, 0)]
    curves = {s.name: ScalingCurve(s.name, {1: 1.0, 2: 1.9}) for s in specs}
    ctl = Controller(specs, curves, Planner(method="dp", objective="speedup"), model_costs=False)
    ctl.nodes_joined(["n1", "n2", "n3", "n4", "n5"])
    ctl.replan(0.0)
    a, b = ctl.active["a"].state, ctl.active["b"].state
    assert a.size == b.size == 2
    free = ({"n1", "n2", "n3", "n4", "n5"} - set(a.nodes) - set(b.nodes)).pop()
    b_node, a_first = b.nodes[0], a.nodes[0]
    ctl.bind("a", b_node)                       # a's first rank landed on a node the plan gave b: swap
    assert b_node in a.nodes and a_first in b.nodes and len(set(a.nodes) | set(b.nodes)) == 4
    ctl.bind("a", free, confirmed={b_node})     # its second rank on the free node: b keeps its nodes
    assert set(a.nodes) == {b_node, free} and b.size == 2 and free not in b.nodes
    assert ctl.nodes_left([b_node]) == ["a"]    # a reclaim now hits the job that really runs there


def test_dp_and_milp_follow_the_same_trajectory_over_a_replay():
    """Exact ties (every job's U(1) is 1 under speedup) are broken the same way by both exact solvers, and the
    MILP is solved to a zero gap: the two replays make the same plan at every event."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = 9
    starts = rng.integers(0, 2000, 40).astype(float)
    iv = IdleIntervals.build([f"n{i}" for i in range(n)], rng.integers(0, n, 40), starts,
                             starts + rng.integers(30, 900, 40), 0, 3000)
    js = JobSet([JobSpec(f"j{i}", "lin", 1, 4, 10.0, 5.0, 3e5, 10.0 * i) for i in range(6)], {"lin": LINEAR})
    trajectories = {}
    for method in ("dp", "milp"):
        planner = Planner(method=method)
        seen = []
        plan = planner.plan

        def spy(jobs, pool, now=0.0, remaining=None, plan=plan, seen=seen):
            p = plan(jobs, pool, now, remaining)
            seen.append((now, tuple(sorted(p.sizes.items()))))
            return p

        planner.plan = spy
        simulate(iv, js, planner)
        trajectories[method] = seen
    assert len(trajectories["dp"]) > 20
    assert trajectories["dp"] == trajectories["milp"]


def test_submit_times_relative_to_the_window_and_no_silent_zero():
    """A job set written for another era: replayed as written, no job could ever arrive - an error naming the
    option, not e_idle 0; relative submit times put the first job at the window's start, gaps kept."""
    from parsl_bft.sim.replay import NoJobAdmitted

    iv = IdleIntervals.build(["n0", "n1"], [0, 1], [8e8, 8e8 + 50], [8e8 + 1000, 8e8 + 1000], t0=8e8, t1=8e8 + 1000)
    js = jobset(job("a", samples=5e4, submit=1.6e9), job("b", samples=5e4, submit=1.6e9 + 300))
    with pytest.raises(NoJobAdmitted, match="--submits relative"):
        simulate(iv, js, Planner(method="dp"), ceiling=True)
    res = simulate(iv, js, Planner(method="dp"), submits="relative")
    assert {a.name: a.state.spec.submit for a in res.jobs} == {"a": 8e8, "b": 8e8 + 300}
    assert res.metrics()["e_idle"] > 0.5 and res.metrics()["jobs_finished"] == 2


def test_cli_simulate_refuses_a_replay_no_job_can_enter(tmp_path, shared_data):
    csv = tmp_path / "old.csv"
    csv.write_text("node,idle_start,idle_end\n" + "".join(f"n{i},800000000,800007200\n" for i in range(4)))
    base = [sys.executable, "-m", "parsl_bft.cli", "simulate", "--idle-intervals", str(csv), "--jobs",
            str(shared_data / "jobs" / "imagenet_mix.jobs.csv"), "--planner", "dp", "--no-ceiling", "--no-mask"]
    r = subprocess.run(base, capture_output=True, text=True)
    assert r.returncode == 2 and "no job can be admitted" in r.stderr + r.stdout and "Traceback" not in r.stderr
    out = tmp_path / "r.json"
    r = subprocess.run([*base, "--submits", "relative", "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["e_idle"] > 0.5


def test_a_replay_whose_jobs_run_out_early_says_so(tmp_path, capsys):
    """All jobs done a few minutes into a 6 h replay: its e_idle measures how little work there was, not how well
    the idle nodes were used - a warning says so (it exited 0 with e_idle 0.002 and nothing else)."""
    from parsl_bft.cli import main
    (tmp_path / "s.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\n"
                                         "a,m,1,8,1,1,1000,0\n")
    (tmp_path / "s.scaling.csv").write_text("model,nodes,samples_per_sec\nm,1,10\nm,8,70\n")
    (tmp_path / "idle.csv").write_text("node,idle_start,idle_end\n" + "".join(f"n{i},0,21600\n" for i in range(4)))
    assert main(["simulate", "--idle-intervals", str(tmp_path / "idle.csv"), "--jobs", str(tmp_path / "s.jobs.csv"),
                 "--no-ceiling", "--no-mask"]) == 0          # (every node idle for hours: an outage, unmasked)
    assert "warning: all 1 jobs finished 0% into the replay" in capsys.readouterr().err


def _swf(path, rows):
    path.write_text("; MaxNodes: 8\n" + "".join(
        f"{i + 1} {s} {w} {r} {n} -1 -1 {n} {r} -1 1 -1 -1 -1 0 -1 -1 -1\n" for i, (s, w, r, n) in enumerate(rows)))
    return path


def test_a_parsed_log_is_read_back_from_the_cache(tmp_path, monkeypatch):
    """The second load of the same log with the same options is not parsed again; a changed file is."""
    import os
    import warnings

    from parsl_bft.idle import sources
    monkeypatch.setenv("PARSL_BFT_CACHE", str(tmp_path / "cache"))
    log = _swf(tmp_path / "x.swf", [(0, 0, 100, 4), (10, 0, 50, 2), (200, 0, 100, 8)])
    built = []
    real = sources._load_swf
    monkeypatch.setattr(sources, "_load_swf", lambda *a: built.append(a) or real(*a))
    first = sources.load_source(log)
    again = sources.load_source(log)
    assert len(built) == 1
    assert (again.intervals.start == first.intervals.start).all() and again.description == first.description
    sources.load_source(log, schedule="easy")          # other options: another entry
    assert len(built) == 2
    os.utime(log, ns=(1, 1))                           # the file changed
    sources.load_source(log)
    assert len(built) == 3
    monkeypatch.setenv("PARSL_BFT_CACHE", "off")
    sources.load_source(log)
    assert len(built) == 4 and not list((tmp_path / "cache").glob(".tmp-*"))
    monkeypatch.setenv("PARSL_BFT_CACHE", str(tmp_path / "cache"))
    with warnings.catch_warnings(record=True) as said:     # a load's warnings come again from the cache
        warnings.simplefilter("always")
        monkeypatch.setattr(sources, "_load_swf", lambda *a: warnings.warn("odd rows", stacklevel=1) or real(*a))
        sources.load_source(log, units="nodes")
        monkeypatch.setattr(sources, "_load_swf", real)
        sources.load_source(log, units="nodes")
    assert [str(w.message) for w in said] == ["odd rows", "odd rows"]


def test_simulate_by_default_grows_jobs_onto_nodes_that_join(tmp_path):
    """Nodes joining one at a time: with BFTrainer's T_fwd of 10 s, shorter than the 18 s restart, the running
    job never grows onto them (they stay idle and equal-share does better); the default look-ahead (60 s) grows
    it while a growth pays back its restart within it (here: to 5 nodes, the 6th stays idle)."""
    from parsl_bft.cli import main
    (tmp_path / "s.jobs.csv").write_text("name,model,min_nodes,max_nodes,t_up,t_down,samples,submit\n"
                                         "a,lin,1,8,18,11,1e12,0\n")
    (tmp_path / "s.scaling.csv").write_text("model,nodes,samples_per_sec\nlin,1,100\nlin,8,800\n")
    (tmp_path / "idle.csv").write_text("node,idle_start,idle_end\n" + "".join(f"n{i},{i * 600},7200\n"
                                                                              for i in range(6)))
    util = {}
    for tfwd in ([], ["--tfwd", "10"]):
        assert main(["simulate", "--idle-intervals", str(tmp_path / "idle.csv"), "--jobs",
                     str(tmp_path / "s.jobs.csv"), "--no-ceiling", "--no-mask", "--json", str(tmp_path / "r.json"),
                     *tfwd]) == 0
        util[bool(tfwd)] = json.loads((tmp_path / "r.json").read_text())["util"]
    assert util[False] > 0.98 and util[True] < 0.6
