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
    times, ends = s.reservation_timeline
    pred = make_predictor("easy", s)
    assert isinstance(pred, EasyReservations)
    assert pred.reservation(0.5) == math.inf        # nothing waits yet
    assert pred.reservation(50.0) == 150.0           # the requested walltime, not the real end (100)
    pred.joined(["n6", "n7"], 0.0)
    assert all(v <= 100.0 for v in pred.remaining(50.0, ["n6", "n7"]).values())
    with pytest.raises(ValueError, match="schedule easy"):
        make_predictor("easy", None)


def test_hazard_values_growth_onto_short_lived_nodes_lower_and_leaves_held_nodes_alone():
    job = JobState(JobSpec("a", "lin", 1, 8, 0, 10, 1e9), LIN, ("h0", "h1"))
    rem_long = {"h0": 5.0, "h1": 5.0, "f0": 1e5, "f1": 1e5}
    rem_short = {"h0": 5.0, "h1": 5.0, "f0": 20.0, "f1": 20.0}
    vals = {}
    for label, rem in (("long", rem_long), ("short", rem_short)):
        p = Planner(method="dp", t_fwd=60, horizon_aware=True)
        free = np.array(sorted([rem["f0"], rem["f1"]], reverse=True))
        prob = build_problem([job], 4, Speedup(), 60.0, 0.0, rem, free, horizon_model="hazard")
        vals[label] = dict(zip(prob.allowed[0].tolist(), prob.value[0].tolist()))
        sizes = p.plan([job], ["h0", "h1", "f0", "f1"], remaining=rem).sizes
        vals[label]["plan"] = sizes["a"]
    # its own nodes (even short-lived ones) are valued as without predictions: T * U(k)
    assert vals["short"][2] == pytest.approx(60 * 2) and vals["long"][2] == pytest.approx(60 * 2)
    # growing onto nodes leaving in 20 s costs a reclaim pause (10 s) at size 4 once per 20 s, per node
    assert vals["short"][4] == pytest.approx(60 * 4 * (1 - 10 * 2 / 20.0))
    assert vals["long"]["plan"] == 4 and vals["short"]["plan"] == 2


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
