"""The Philly-derived workload for the dedicated-cluster simulation: the offered load it is replayed at."""
import pytest

from parsl_bft.scaling import ScalingCurve
from parsl_bft.sim.philly import offered_load, read_philly

CURVES = {"m": ScalingCurve("m", {1: 10.0, 2: 20.0, 4: 40.0, 8: 80.0})}


@pytest.fixture
def trace(tmp_path):
    """Ten jobs over ten hours, 1-4 GPUs, one hour each: 20 GPU-hours on 48 GPUs over 9 h of arrivals."""
    rows = [f"2017-10-02 {h:02d}:{7 * h % 60:02d}:00,3600,{1 + h % 4}" for h in range(10)]
    p = tmp_path / "philly.csv"
    p.write_text("timestamp,duration,num_gpus\n" + "\n".join(rows) + "\n")
    return p


def test_load_compresses_arrivals_and_keeps_their_order_and_work(trace):
    plain = read_philly(trace, CURVES, n_jobs=10, days=1)
    gaps = [j.submit for j in plain.jobs]
    work = sum(j.samples for j in plain.jobs) / 10.0                  # single-GPU seconds
    assert offered_load(plain, 48) == pytest.approx(work / (48 * (gaps[-1] - gaps[0])))
    for load in (0.5, 2.0):
        js = read_philly(trace, CURVES, n_jobs=10, days=1, load=load)
        assert offered_load(js, 48) == pytest.approx(load)
        assert [j.samples for j in js.jobs] == [j.samples for j in plain.jobs]
        sub = [j.submit for j in js.jobs]
        assert sub[0] == 0 and sub == sorted(sub)
        # burstiness kept: every gap scaled by the same factor
        assert [b / a for a, b in zip(gaps[1:], sub[1:])] == pytest.approx([sub[-1] / gaps[-1]] * 9)


@pytest.mark.parametrize("load", [0, -1, float("inf"), float("nan")])
def test_a_load_that_is_not_positive_is_refused(trace, load):
    with pytest.raises(ValueError, match="load must be > 0"):
        read_philly(trace, CURVES, n_jobs=10, days=1, load=load)


def test_arrivals_at_one_moment_are_left_there(tmp_path):
    p = tmp_path / "burst.csv"
    p.write_text("timestamp,duration,num_gpus\n" + "2017-10-02 01:00:00,600,2\n" * 3)
    js = read_philly(p, CURVES, n_jobs=3, days=1, load=0.8)
    assert [j.submit for j in js.jobs] == [0.0, 0.0, 0.0]


def test_a_rigid_draw_is_the_same_jobs_at_their_requested_sizes(trace):
    elastic = read_philly(trace, CURVES, n_jobs=10, days=1, load=0.8, freeze_share=0.5)
    rigid = read_philly(trace, CURVES, n_jobs=10, days=1, load=0.8, freeze_share=0.5, rigid=True)
    asked = [1 + h % 4 for h in range(10)]
    assert [(j.min_nodes, j.max_nodes) for j in rigid.jobs] == [(g, g) for g in asked]
    assert [(j.min_nodes, j.max_nodes) for j in elastic.jobs] == [(1, 2 * g) for g in asked]
    same = ("name", "model", "samples", "submit", "freeze")
    assert [[getattr(j, k) for k in same] for j in rigid.jobs] == [[getattr(j, k) for k in same] for j in elastic.jobs]


def _replay(js, planner):
    from parsl_bft.sim import simulate
    from parsl_bft.sim.philly import dedicated_cluster

    return simulate(dedicated_cluster(4, 0.0, 1e6), js, planner, freeze=False, until_done=True,
                    max_concurrent=len(js.jobs))


def _jobs(specs):
    from parsl_bft.jobs import JobSet, JobSpec

    return JobSet([JobSpec(n, "m", g, g, 1.0, 1.0, g * 10.0 * t, submit=s) for n, g, t, s in specs], CURVES, {})


def test_fifo_backfill_runs_gangs_in_order_and_backfills_only_what_does_not_delay_the_head():
    """4 nodes: a (3 nodes, 100 s) runs; b (4 nodes) waits for it; c (1 node, 50 s) fits beside a and ends
    before b could start: backfilled; d (1 node, 500 s) would delay b: waits for it."""
    from parsl_bft.sim.baselines import FifoBackfill

    res = _replay(_jobs([("a", 3, 100, 0), ("b", 4, 100, 1), ("c", 1, 50, 2), ("d", 1, 500, 3)]), FifoBackfill())
    end = {r["name"]: r["finished_at"] for r in res.job_rows()}
    assert end["a"] == pytest.approx(100) and end["c"] == pytest.approx(52)
    assert end["b"] == pytest.approx(200) and end["d"] == pytest.approx(700)


def test_tiresias_preempts_the_job_with_most_attained_service_for_a_new_one():
    """a (4 nodes, long) has attained over an hour of GPU time when b (4 nodes, short) arrives: b runs first
    (a pays its t_down), then a finishes."""
    from parsl_bft.sim.baselines import TiresiasLas

    res = _replay(_jobs([("a", 4, 2000, 0), ("b", 4, 100, 1000)]), TiresiasLas(thresholds=(3600.0,)))
    rows = {r["name"]: r for r in res.job_rows()}
    assert rows["b"]["finished_at"] == pytest.approx(1100)
    assert rows["a"]["finished_at"] > 2100 and rows["a"]["rescales"] == 1
