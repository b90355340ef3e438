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
