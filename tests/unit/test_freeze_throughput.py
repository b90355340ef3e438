"""Layer elasticity in the simulator's and the planner's eyes: the layer-aware throughput model (known answers:
the public BERT profile, hand-made shares), the synthetic freeze profiles, a replay at Unix-epoch times."""
import numpy as np
import pytest

from parsl_bft.jobs import JobSet, JobSpec
from parsl_bft.planner import Planner
from parsl_bft.planner.freeze import BERT_PROFILE, GradStats, LayerThroughput, penalty_curve, saved_backward
from parsl_bft.planner.problem import JobState
from parsl_bft.scaling import LayerProfile, ScalingCurve
from parsl_bft.sim import simulate
from parsl_bft.sim.freezing import SETTLED, settle_schedule, synthetic_layers, synthetic_profile
from parsl_bft.sim.philly import dedicated_cluster


def bert(points=True) -> LayerThroughput:
    """80 atomic layers of equal compute, the embeddings (1% of the compute, 20% of the parameters) first; level
    72 measured on 1, 8 and 16 GPUs (the notes' public profile, batch 8 per GPU)."""
    comp = np.r_[0.01, np.full(79, 0.99 / 79)]
    par = np.r_[0.2, np.full(79, 0.8 / 79)]
    shares = {f: (float(comp[:f].sum()), float(par[:f].sum())) for f in range(1, 80)}
    curve = ScalingCurve("bert", {n: 8 * n / t0 for n, (t0, _) in BERT_PROFILE.items()})
    pts = {(n, 72): 8 * n / t1 for n, (_, t1) in BERT_PROFILE.items()} if points else {}
    return LayerThroughput(curve, LayerProfile("bert", 80, shares, pts))


def test_priors_reproduce_the_public_bert_profile_placement_included():
    """Unfitted, the model gives BERT's 2.26x on one GPU and ~1.35x on 8 and 16 (the all-reduce that the frozen
    backward hid shows), within 6%; so does a fit on the three points."""
    prior, fitted = bert(points=False), bert()
    for n, (t0, t1) in BERT_PROFILE.items():
        assert prior.predict(n, 72) / prior.curve.rate(n) == pytest.approx(t0 / t1, rel=0.06)
        assert fitted.predict(n, 72) / fitted.curve.rate(n) == pytest.approx(t0 / t1, rel=0.06)
    assert prior.speedup(16, 72) < prior.speedup(1, 72) / 1.5
    # a curve without synchronisation cost (two ranks at full efficiency): as on one node
    ideal = LayerThroughput(ScalingCurve("x", {1: 10.0, 2: 20.0}), prior.profile)
    assert ideal.speedup(2, 72) == pytest.approx(ideal.speedup(1, 72))


def test_saved_backward_counts_the_first_trainable_layers_input_gradient():
    """Forward shares 0.1 / 0.6 / 0.3: freezing layer 0 spares its weight gradient (0.1) and layer 1's input
    gradient (0.6), of a step of 3 - 0.1 (layer 0 never computes an input gradient)."""
    sigma = saved_backward({0: (0.0, 0.0), 1: (0.1, 0.0), 2: (0.7, 0.0)}, 3)
    assert sigma[0] == 0.0
    assert sigma[1] == pytest.approx((0.1 + 0.7 - 0.1) / 2.9)
    assert sigma[2] == pytest.approx((0.7 + 1.0 - 0.1) / 2.9)
    assert saved_backward({0: (0.0, 0.0), 2: (0.7, 0.0)}, 4)[2] == pytest.approx(1.4 / 3)   # levels 1, 3 unknown


def test_fit_recovers_parameters_and_a_flat_curve_still_pays_on_one_node():
    shares = {1: (0.3, 0.1), 2: (0.6, 0.3), 3: (0.9, 0.8)}
    curve = ScalingCurve("m", {1: 100.0, 2: 190.0, 4: 340.0, 8: 560.0})
    truth = LayerThroughput(curve, LayerProfile("m", 4, shares))
    truth.beta, truth.gamma, truth.omega = 0.8, 0.5, 1.3
    pts = {(n, f): truth.predict(n, f) for n in (1, 2, 8) for f in (1, 2, 3)}
    fitted = LayerThroughput(curve, LayerProfile("m", 4, shares, pts))
    assert fitted.params == pytest.approx((0.8, 0.5, 1.3), abs=1e-9)
    assert fitted.rate(4, 2) == pytest.approx(truth.predict(4, 2))
    errs = fitted.heldout()
    assert set(errs) == set(pts) and all(p == pytest.approx(r) for r, p in errs.values())
    # two ranks no faster than one (shared cores): the one-rank compute is still compute, freezing still pays
    flat = LayerThroughput(ScalingCurve("m", {1: 100.0, 2: 100.0}), LayerProfile("m", 4, shares))
    assert flat.speedup(1, 3) > 1.5 and flat.speedup(2, 3) >= 1.0    # hidden sync costs at most what was spared


def test_synthetic_profiles_settle_in_order_and_the_penalty_follows():
    s = settle_schedule(8)
    assert np.all(np.diff(s) > 0) and np.isinf(s[-1])
    assert np.sum(s < 1) == 5                                   # PipeTransformer: ~63% of the layers by the end
    prof = synthetic_profile(JobSpec("j", "m", 1, 4, 1, 1, 100))
    early, late = (GradStats.from_dict(prof.stats(x)) for x in (0.1, 0.9))
    assert prof.stats(0.01) is None
    i = int(np.argmax(np.array(prof.settle) > 0.9))            # the first layer still learning at 0.9
    assert late.signal[i - 1] < SETTLED < late.signal[i] and np.all(np.diff(late.signal) > 0)
    assert np.all(penalty_curve(late, 8) <= penalty_curve(early, 8))
    assert penalty_curve(late, 8)[i] < penalty_curve(early, 8)[i] / 2 and penalty_curve(late, 8)[3] < 0.01


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_replay_at_unix_epoch_times_finishes():
    """Idle traces count in Unix time (~1.6e9 s: steps below ~0.2 us vanish); the replay used to stall on a job
    a rounding error short of its end or of a statistics report."""
    t0 = 1.6e9
    rng = np.random.default_rng(3)
    curves = {"m": ScalingCurve("m", {1: 1000.0, 2: 1900.0, 4: 3500.0})}
    jobs = [JobSpec(f"j{i}", "m", 1, 4, 10.0, 10.0, float(rng.uniform(1e5, 1e7)), submit=t0 + 600 * i,
                    freeze="auto" if i % 2 else "off", accuracy_budget=0.005 if i % 2 else 0.0) for i in range(24)]
    js = JobSet(jobs, curves, {"m": synthetic_layers("m")})
    for freeze in (False, True):
        m = simulate(dedicated_cluster(6, t0, t0 + 30 * 86400), js, Planner(method="dp", objective="jct"),
                     freeze=freeze, until_done=True, max_concurrent=8).metrics()
        assert m["jobs_finished"] == 24 and m["budget_violations"] == 0


def test_a_costly_level_is_taken_where_it_pays_and_the_budget_allows():
    """Level 3 measured at 3x on 8 nodes costs 0.25 of the progress (layer 2 still learns): 3 x 0.75 beats level
    2's free speed-up once the budget holds twice its spend over the half of the job left (0.25)."""
    curve = ScalingCurve("m", {1: 100.0, 2: 190.0, 4: 340.0, 8: 560.0})
    layers = LayerThroughput(curve, LayerProfile("m", 4, {1: (0.3, 0.1), 2: (0.6, 0.3), 3: (0.9, 0.8)},
                                                 {(8, 3): 3 * curve.rate(8)}))
    stats = {"prev": [10.0, 5.0, 8.0, 9.0], "now": [10.0, 5.0, 6.0, 3.0]}     # layer 2: 0.25 of the progress
    nodes = [f"n{i}" for i in range(8)]

    def level(budget):
        j = JobState(JobSpec("a", "m", 1, 8, 1.0, 1.0, 1e6, freeze="auto", accuracy_budget=budget), curve,
                     tuple(nodes), grad_stats=stats, layers=layers, samples_done=5e5)
        return Planner(method="dp", t_fwd=1e4).plan([j], nodes).freeze["a"]

    assert penalty_curve(GradStats.from_dict(stats), 4)[3] == pytest.approx(0.25)
    assert (level(0.2), level(0.3)) == (2, 3)
