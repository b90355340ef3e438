"""Hole-end predictions the planner can know (past only, or the scheduler's reservations), the hazard valuation,
and the zero-cost ceiling a replay reports."""
import math

import numpy as np
import pytest

from parsl_bft.idle.easy import easy_schedule
from parsl_bft.idle.intervals import IdleIntervals
from parsl_bft.idle.predict import Clairvoyant, EasyReservations, HoleHistory, make_predictor
from parsl_bft.idle.swf import read_swf
from parsl_bft.jobs import JobSet, JobSpec
from parsl_bft.planner import JobState, Planner
from parsl_bft.planner.cohorts import CohortHazard, Cohorts
from parsl_bft.planner.objectives import Speedup
from parsl_bft.planner.planner import build_problem
from parsl_bft.scaling import ScalingCurve
from parsl_bft.sim import simulate

LIN = ScalingCurve("lin", {1: 100.0, 2: 200.0, 4: 400.0, 8: 800.0})


def test_history_predicts_the_conditional_median_residual_from_completed_holes_only():
    h = HoleHistory(min_samples=5, floor=0.0)
    names = [f"n{i}" for i in range(40)]
    h.joined(names, 0.0)
    h.left(names[:20], 100.0)            # 20 holes of 100 s
    h.left(names[20:39], 1000.0)         # 19 holes of 1000 s; n39 is still idle (its length is unknown)
    # a node idle for 200 s: only the 1000 s holes are longer, so 800 s are left
    h.joined(["x"], 800.0)
    assert h.remaining(1000.0, ["x"])["x"] == pytest.approx(800.0)
    # a young node: median of (L - 10 | L > 10) over 20 x 90 and 19 x 990 -> 90
    h.joined(["y"], 990.0)
    assert h.remaining(1000.0, ["y"])["y"] == pytest.approx(90.0)
    # older than every hole seen: too few longer holes, predict as long again as it has lasted (Lindy)
    assert h.remaining(3000.0, ["n39"])["n39"] == pytest.approx(3000.0)


def test_replay_predictions_do_not_see_the_future():
    """Two logs equal up to t = 500 and different after: what the planner is told at t <= 500 is the same."""
    names = [f"n{i}" for i in range(6)]
    node = [0, 1, 2, 3, 4, 5, 0, 1]
    start = [0, 0, 10, 20, 30, 40, 300, 300]
    end_a = [200, 250, 400, 450, 800, 900, 700, 1000]
    end_b = [200, 250, 400, 450, 3000, 5000, 2500, 600]
    seen = {}
    for label, end in (("a", end_a), ("b", end_b)):
        iv = IdleIntervals.build(names, node, start, end, 0, 5000)
        calls = []

        class Spy(Planner):
            def plan(self, jobs, pool, now=0.0, remaining=None):
                if now <= 500:
                    calls.append((now, tuple(sorted(pool)), tuple(sorted((remaining or {}).items()))))
                return super().plan(jobs, pool, now, remaining)

        js = JobSet([JobSpec("a", "lin", 1, 8, 10, 5, 1e12)], {"lin": LIN})
        simulate(iv, js, Spy(method="dp", horizon_aware=True), predict="history")
        seen[label] = calls
    assert seen["a"] and seen["a"] == seen["b"]
    # the clairvoyant predictor, by contrast, differs (it is told the real ends)
    c = Clairvoyant()
    c.joined(["n4"], 30.0, [800.0])
    assert c.remaining(100.0, ["n4"]) == {"n4": 700.0}


def test_easy_reservation_timeline_bounds_predictions(tmp_path):
    head = "; MaxNodes: 8\n; MaxProcs: 8\n"

    def line(i, submit, run, procs, req):
        return f"{i} {submit} 0 {run} {procs} -1 -1 {procs} {req} -1 1 1 1 1 1 -1 -1 -1\n"

    p = tmp_path / "t.swf"
    # 6 nodes busy until 100 (requested 150); an 8-node job arrives at 1 and is planned to start at 150
    p.write_text(head + line(1, 0, 100, 6, 150) + line(2, 1, 10, 8, 10))
    s = easy_schedule(read_swf(p))
    _times, _ends = s.reservation_timeline
    pred = make_predictor("easy", s)
    assert isinstance(pred, EasyReservations)
    assert pred.reservation(0.5) == math.inf        # nothing waits yet
    assert pred.reservation(50.0) == 150.0           # the requested walltime, not the real end (100)
    pred.joined(["n6", "n7"], 0.0)
    assert all(v <= 100.0 for v in pred.remaining(50.0, ["n6", "n7"]).values())
    with pytest.raises(ValueError, match="schedule easy"):
        make_predictor("easy", None)


def test_hazard_charges_one_reclaim_per_new_cohort_and_leaves_held_nodes_alone():
    """Growing onto nodes that leave within T_fwd costs one reclaim pause per cohort (nodes that joined together
    leave together), not per node; long-lived nodes cost next to nothing; the job's own nodes carry no term."""
    job = JobState(JobSpec("a", "lin", 1, 8, 0, 25, 1e9), LIN, ("h0", "h1"))
    pool = ["h0", "h1", "f0", "f1"]
    p_leave = -math.expm1(-60 / 5.0)                 # a cohort with 5 s left leaves within T_fwd = 60 s
    cases = {"long, 2 cohorts": ({"f0": 1e5, "f1": 1e5}, ["x", "y"]),
             "short, 2 cohorts": ({"f0": 5.0, "f1": 5.0}, ["x", "y"]),
             "short, 1 cohort": ({"f0": 5.0, "f1": 5.0}, ["x", "x"])}
    vals = {}
    for label, (free_rem, keys) in cases.items():
        rem = {"h0": 5.0, "h1": 5.0, **free_rem}
        prob = build_problem([job], 4, Speedup(), 60.0, 0.0, rem, np.array([free_rem["f0"], free_rem["f1"]]),
                             horizon_model="hazard", free_cohorts=keys, cohorts={"h0": "h", "h1": "h"})
        vals[label] = dict(zip(prob.allowed[0].tolist(), prob.value[0].tolist()))
    for v in vals.values():        # its own (short-lived) nodes are valued as without predictions: T * U(k)
        assert v[2] == pytest.approx(60 * 2) and v[1] == pytest.approx(60 * 1 - 25 * 2)
    assert vals["short, 2 cohorts"][4] == pytest.approx(60 * 4 * (1 - 25 * 2 * p_leave / 60))
    assert vals["short, 1 cohort"][4] == pytest.approx(60 * 4 * (1 - 25 * p_leave / 60))
    assert vals["short, 2 cohorts"][4] < 60 * 2 < vals["short, 1 cohort"][4] < vals["long, 2 cohorts"][4]
    # a cohort the job already holds adds no reclaim
    prob = build_problem([job], 4, Speedup(), 60.0, 0.0, {"h0": 5.0, "h1": 5.0, "f0": 5.0, "f1": 5.0},
                         np.array([5.0, 5.0]), free_cohorts=["h", "h"], cohorts={"h0": "h", "h1": "h"})
    assert prob.value[0][list(prob.allowed[0]).index(4)] == pytest.approx(60 * 4)
    # the planner learns cohorts from the pools it is shown: nodes first seen in one plan joined together
    for pools, want in (([["h0", "h1"], pool], 4), ([["h0", "h1"], ["h0", "h1", "f0"], pool], 2)):
        planner = Planner(method="dp", t_fwd=60, horizon_aware=True)
        for t, seen in enumerate(pools):
            planner.plan([JobState(job.spec, LIN)], seen, now=t, remaining={n: 1e5 for n in seen})
        assert planner.plan([job], pool, now=10.0, remaining={n: 5.0 for n in pool}).sizes["a"] == want, pools


def test_cohorts_are_the_nodes_first_seen_in_one_plan_and_restart_when_time_goes_back():
    c = Cohorts()
    assert c.update(["a", "b"], 0.0) == {"a": 0.0, "b": 0.0}
    assert c.update(["b", "c", "d"], 5.0) == {"b": 0.0, "c": 5.0, "d": 5.0}      # a left, c and d joined
    assert c.update(["a", "d"], 7.0) == {"a": 7.0, "d": 5.0}                     # a is back: a new hole
    assert c.update(["a", "d"], 1.0) == {"a": 1.0, "d": 1.0}                     # a new replay
    with pytest.raises(ValueError, match="free_cohorts"):
        CohortHazard(np.array([1.0, 2.0]), ["x"], 60.0)


def test_ceiling_is_the_same_replay_with_free_rescales_and_reclaims():
    names = ["n0", "n1", "n2", "n3"]
    iv = IdleIntervals.build(names, [0, 1, 2, 3, 2, 3], [0, 0, 0, 0, 300, 300], [1000, 1000, 100, 150, 700, 900],
                             0, 1000)
    js = JobSet([JobSpec("a", "lin", 1, 8, 20, 10, 1e12), JobSpec("b", "lin", 1, 8, 20, 10, 1e12)], {"lin": LIN})
    res = simulate(iv, js, Planner(method="dp"), ceiling=True)
    m = res.metrics()
    assert m["reclaim_loss"] > 0 and m["e_idle"] < m["ceiling_e_idle"]
    free = JobSet([JobSpec(j.name, "lin", 1, 8, 0, 0, 1e12) for j in js.jobs], {"lin": LIN})
    alone = simulate(iv, free, Planner(method="dp")).metrics()
    assert m["ceiling_e_idle"] == pytest.approx(alone["e_idle"])
    assert "ceiling_e_idle" not in simulate(iv, js, Planner(method="dp")).metrics()


def test_a_young_cohort_is_used_whole_by_a_horizon_aware_replay():
    """Eight nodes become idle together and stay 1,000 s; the history predictor has seen no hole yet and gives
    them 30 s. One reclaim for the cohort is worth risking: the job takes all eight (one per node would have
    kept it at two)."""
    names = [f"n{i}" for i in range(8)]
    iv = IdleIntervals.build(names, list(range(8)), [0] * 8, [1000] * 8, 0, 1000)
    js = JobSet([JobSpec("a", "lin", 1, 8, 18, 11, 1e12)], {"lin": LIN})
    for predict in ("history", "clairvoyant"):
        m = simulate(iv, js, Planner(method="dp", t_fwd=60, horizon_aware=True), predict=predict).metrics()
        assert m["util"] == pytest.approx(1.0), predict
