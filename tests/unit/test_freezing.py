"""Layer elasticity: declaring it, the layer-aware throughput and penalty models, and the planner's choice."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from parsl_bft.errors import InputError
from parsl_bft.jobs import JobSet, JobSpec, load_jobset, read_jobs_csv, write_jobs_csv
from parsl_bft.planner import Planner
from parsl_bft.planner.freeze import GradStats, LayerThroughput, penalty_curve
from parsl_bft.planner.problem import JobState
from parsl_bft.scaling import LayerProfile, ScalingCurve, read_scaling_csv, read_scaling_table, write_scaling_csv

CURVE = ScalingCurve("m", {1: 100.0, 2: 190.0, 4: 340.0, 8: 560.0})
SHARES = {1: (0.3, 0.1), 2: (0.6, 0.3), 3: (0.9, 0.8)}
# layers 0 and 1 have settled (their gradient norm no longer changes), 2 and 3 still learn
SETTLED = {"prev": [10.0, 5.0, 8.0, 9.0], "now": [10.0, 5.0, 6.0, 3.0]}


def profile(points=None) -> LayerThroughput:
    return LayerThroughput(CURVE, LayerProfile("m", 4, SHARES, points or {}))


def job(name="a", budget=0.01, stats=SETTLED, freeze="auto", level=0, **kw) -> JobState:
    spec = JobSpec(name, "m", 1, 8, 1.0, 1.0, 1e6, freeze=freeze, accuracy_budget=budget if freeze != "off" else 0,
                   **kw)
    return JobState(spec, CURVE, grad_stats=stats, layers=profile(), freeze=level)


# --- declaring it ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, field", [({"freeze": "auto", "accuracy_budget": -0.1}, "accuracy_budget"),
                                       ({"freeze": "auto", "accuracy_budget": 0.0}, "accuracy_budget"),
                                       ({"freeze": "sometimes", "accuracy_budget": 0.01}, "freeze")])
def test_bad_freeze_declarations_name_the_field(kw, field):
    with pytest.raises(ValueError) as e:
        JobSpec("a", "m", 1, 2, 0, 0, 10, **kw)
    assert e.value.field == field


def test_freeze_columns_round_trip_and_old_files_still_read(tmp_path):
    jobs = [JobSpec("a", "m", 1, 4, 1, 1, 100), JobSpec("b", "m", 1, 4, 1, 1, 100, freeze="auto",
                                                          accuracy_budget=0.005, unfreeze=True)]
    write_jobs_csv(tmp_path / "x.jobs.csv", jobs)
    assert read_jobs_csv(tmp_path / "x.jobs.csv") == jobs
    write_jobs_csv(tmp_path / "old.jobs.csv", jobs[:1])        # defaults only: no new columns written
    assert "freeze" not in (tmp_path / "old.jobs.csv").read_text()
    write_scaling_csv(tmp_path / "old.scaling.csv", [("m", 1, 100.0), ("m", 2, 190.0)])
    assert read_scaling_csv(tmp_path / "old.scaling.csv")["m"].points == {1: 100.0, 2: 190.0}
    with pytest.raises(InputError, match="no freeze levels"):
        load_jobset(tmp_path / "x.jobs.csv", tmp_path / "old.scaling.csv")
    write_scaling_csv(tmp_path / "x.scaling.csv", [("m", 1, 100.0), ("m", 2, 190.0),
                                                   ("m", 1, 120.0, 1, 3, 0.3, 0.1), ("m", 2, 260.0, 2, 3, 0.6, 0.4)])
    js = load_jobset(tmp_path / "x.jobs.csv")
    assert js.curves["m"].points == {1: 100.0, 2: 190.0}      # level-0 rows only
    assert js.layers["m"].levels == [0, 1, 2] and js.layers["m"].points == {(1, 1): 120.0, (2, 2): 260.0}


def test_bad_layer_rows_and_one_layer_models(tmp_path):
    p = tmp_path / "s.scaling.csv"
    p.write_text("model,nodes,samples_per_sec,freeze,layers,frozen_compute,frozen_params\nm,1,10,2,2,0.5,0.5\n")
    with pytest.raises(InputError, match="freezes all 2 layers"):
        read_scaling_table(p)
    p.write_text("model,nodes,samples_per_sec,freeze,layers,frozen_compute,frozen_params\nm,1,10,1,3,1.5,0.5\n")
    with pytest.raises(InputError, match="frozen_compute"):
        read_scaling_table(p)
    p.write_text("model,nodes,samples_per_sec,freeze,layers,frozen_compute,frozen_params\nm,1,10,1,3,0.5,0.5\n"
                 "k,1,10,,,,\n")
    with pytest.raises(InputError, match="measure level 0 too"):
        read_scaling_table(p)
    one = LayerProfile("m", 1, {})
    with pytest.raises(ValueError, match="1 layer"):
        JobSet([JobSpec("a", "m", 1, 2, 0, 0, 10, freeze="auto", accuracy_budget=0.01)], {"m": CURVE}, {"m": one})


# --- models ------------------------------------------------------------------------------------------------


def test_throughput_model_recovers_its_parameters_and_reports_heldout_error():
    truth = profile()
    truth.beta, truth.gamma = 0.55, 0.8
    pts = {(n, f): truth.predict(n, f) for n in (1, 2, 8) for f in (1, 2, 3)}
    fitted = profile(pts)
    assert fitted.beta == pytest.approx(0.55, abs=1e-6) and fitted.gamma == pytest.approx(0.8, abs=1e-6)
    assert fitted.rate(4, 2) == pytest.approx(truth.predict(4, 2))       # an unmeasured pair
    assert fitted.heldout_mape() == pytest.approx(0.0, abs=1e-9)
    noisy = profile({k: v * (1.1 if k[0] == 8 else 1.0) for k, v in pts.items()})
    assert noisy.heldout_mape() > 0.01
    assert noisy.rate(8, 3) == pts[(8, 3)] * 1.1                         # measured points are used as they are


def test_penalty_is_free_for_settled_layers_and_costly_for_learning_ones():
    pen = penalty_curve(GradStats.from_dict(SETTLED), 4)
    assert pen[0] == 0 and pen[1] == 0 and pen[2] == 0       # layers 0, 1: no change left
    assert pen[3] > 0.2                                       # layer 2 still changes faster than the median
    learning = penalty_curve(GradStats.from_dict({"prev": [10, 5, 8, 9], "now": [5, 2.5, 4, 4.5]}), 4)
    assert np.all(np.diff(learning) > 0) and learning[1] == pytest.approx(5 / 16)
    assert list(penalty_curve(None, 4)) == [0, 1, 1, 1]      # no statistics yet: nothing is free


# --- planning ----------------------------------------------------------------------------------------------


NODES = [f"n{i}" for i in range(8)]


@pytest.mark.parametrize("method", ["milp", "dp"])
def test_planner_freezes_what_pays_within_the_budget(method):
    plan = Planner(method=method).plan([job()], NODES)
    assert plan.sizes == {"a": 8} and plan.freeze == {"a": 2}               # settled prefix: free speed
    assert plan.rates["a"] == pytest.approx(profile().rate(8, 2))
    tight = Planner(method=method).plan([job(budget=0.01, stats={"prev": [10, 5, 8, 9], "now": [5, 2.5, 4, 4.5]})],
                                         NODES)
    assert tight.freeze == {"a": 0}                                         # every layer still learns: too dear
    off = Planner(method=method).plan([job(freeze="off")], NODES)
    assert off.freeze == {"a": 0} and off.rates["a"] == CURVE.rate(8)


def test_budget_bounds_the_level_and_levels_only_go_up():
    # level 3 costs 0.25 of progress; half the job is left, so it spends 0.125: allowed with 0.2, not with 0.1
    def with_budget(b, level=0, **kw):
        j = job(budget=b, level=level, **kw)
        j.samples_done = 5e5
        j.nodes = tuple(NODES)
        return Planner(method="dp", t_fwd=1e4).plan([j], NODES).freeze["a"]

    assert with_budget(0.1) == 2
    spent = job(budget=0.2)
    spent.accuracy_spent = 0.1                               # 0.1 + 0.125 > 0.2: level 3 is out
    spent.samples_done, spent.nodes = 5e5, tuple(NODES)
    assert Planner(method="dp", t_fwd=1e4).plan([spent], NODES).freeze["a"] == 2
    assert with_budget(0.2) == 2          # a change of level needs twice the headroom: 2 * 0.125 > 0.2
    # allowed, but it does not pay: on 8 nodes level 3 runs 1.34x (the all-reduce its backward hid shows), x 0.75
    # of the progress < level 2's 1.18x at no cost (tests/unit/test_freeze_throughput.py: a level that pays is taken)
    assert with_budget(0.3) == 2
    # frozen at 3 with everything settled below: it stays (no unfreezing), or goes down only when allowed
    unsettled = {"prev": [10, 5, 8, 9], "now": [5, 2.5, 4, 4.5]}
    assert with_budget(0.5, level=3, stats=unsettled) == 3
    assert with_budget(0.5, level=3, stats=unsettled, unfreeze=True) < 3


def test_a_level_change_at_the_same_size_must_pay_its_restart():
    j = job()
    j.nodes = tuple(NODES)
    slow = job()
    slow.nodes = tuple(NODES)
    cheap = Planner(method="dp", t_fwd=100.0).plan([j], NODES)
    assert cheap.freeze["a"] == 2 and cheap.rescale_cost["a"] > 0
    dear = Planner(method="dp", t_fwd=0.01).plan([slow], NODES)   # 1 s of restart for 0.01 s of gain: stay
    assert dear.freeze["a"] == 0 and dear.rescale_cost["a"] == 0


# --- fragments ---------------------------------------------------------------------------------------------


def fragment(d, **kw):
    from parsl_bft.train.fragment import FragmentConfig
    return FragmentConfig(**{**dict(job="a", workload="images", checkpoint_dir=str(d), global_batch=32,
                                    workload_args={"n": 256, "width": 8}, fsync=False), **kw})


@pytest.mark.slow
def test_fragments_restore_across_freeze_levels(tmp_path):
    """0 -> 2 frozen -> 0: the frozen blocks' weights stay bit-for-bit while frozen, the still-trainable ones keep
    their momentum across the change, the checkpoint records the level, and unfrozen blocks train again."""
    from parsl_bft.train.checkpoint import CheckpointStore
    from parsl_bft.train.fragment import train_rank

    store = CheckpointStore(tmp_path)
    train_rank(fragment(tmp_path, steps=3))
    before = store.latest()
    train_rank(fragment(tmp_path, steps=3, freeze_layers=2))
    during = store.latest()
    assert during.extra["freeze_layers"] == 2 and during.step == 6
    frozen = [k for k in before.model if k.startswith(("0.", "1."))]
    assert frozen and all(torch.equal(during.model[k], before.model[k]) for k in frozen)
    assert all(not torch.equal(during.model[k], before.model[k]) for k in before.model if k.startswith("3."))
    names = [k for k in before.model if k.startswith(("2.", "3."))]
    assert len(during.optimizer["state"]) == len(names)
    train_rank(fragment(tmp_path, steps=3, freeze_layers=0))
    after = store.latest()
    assert after.extra["freeze_layers"] == 0 and len(after.optimizer["state"]) == len(before.model)
    assert all(not torch.equal(after.model[k], during.model[k]) for k in frozen if k.endswith("weight"))


def test_momentum_carries_over_a_freeze_change():
    from parsl_bft.train.freezing import carry_optimizer_state, freeze_prefix

    def build(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    opt = build(list(net.parameters()))
    net(torch.randn(3, 4)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    net2 = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    net2.load_state_dict(net.state_dict())
    blocks = list(net2.children())
    opt2 = build(freeze_prefix(net2, blocks, 1))
    opt2.load_state_dict(carry_optimizer_state(saved, net2, blocks, 0, opt2, build))
    # net2's trainable params are old indices 2..5; their momentum buffers are the old ones
    for j, i in enumerate(range(2, 6)):
        assert torch.equal(opt2.state_dict()["state"][j]["momentum_buffer"], saved["state"][i]["momentum_buffer"])
    assert not blocks[0].training and not blocks[0].weight.requires_grad
    with pytest.raises(ValueError, match="at least one must train"):
        freeze_prefix(net2, blocks, 3)
    with pytest.raises(ValueError, match="1 layer"):
        freeze_prefix(nn.Linear(2, 2), [nn.Linear(2, 2)], 1)


def test_gradient_statistics_roll_over_intervals_and_keep_frozen_layers():
    from parsl_bft.train.freezing import GradRecorder

    net = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False))
    blocks = list(net.children())
    rec = GradRecorder(blocks, 0, every=1, interval=2)
    for step, scale in enumerate([1.0, 1.0, 3.0, 3.0]):
        net.zero_grad()
        (scale * net(torch.ones(1, 2))).sum().backward()
        rec.record(step)
        if step == 1:
            assert rec.report() == {}                         # one interval: no rate of change yet
    stats = GradStats.from_dict(rec.report())
    assert np.allclose(stats.plasticity(), [2.0, 2.0])       # the gradient tripled in both layers
    frozen = GradRecorder(blocks, 1, restored=rec.state(), every=1, interval=2)
    for step in range(2):
        net.zero_grad()
        net(torch.ones(1, 2)).sum().backward()
        frozen.record(step)
    again = GradStats.from_dict(frozen.report())
    assert again.now[0] == stats.now[0] and again.prev[0] == stats.prev[0]   # frozen: as it was
    assert again.now[1] == pytest.approx(stats.now[1] / 3)
    assert again.signal == pytest.approx([1.0, 1.0])         # the same gradient twice an interval: all signal


def test_signal_tells_noise_from_a_consistent_gradient():
    """Known answers: gradients that are pure noise (what a settled layer sees) have no signal; a gradient that
    pulls one way under the same noise has signal |mu|^2 / (|mu|^2 + sigma^2); energy is the mean |g|^2; a block
    without parameters has neither (freezing it loses nothing)."""
    from parsl_bft.train.freezing import GradRecorder

    net = nn.Sequential(nn.Linear(40, 40, bias=False), nn.Linear(40, 40, bias=False), nn.Linear(40, 40, bias=False),
                        nn.Identity())
    blocks = list(net.children())
    rec = GradRecorder(blocks, 0, every=1, interval=25)
    gen = torch.Generator().manual_seed(0)
    mu = torch.full((40, 40), 1.0)
    for step in range(50):
        noise = [torch.randn(40, 40, generator=gen) for _ in blocks]
        blocks[0].weight.grad = noise[0]                       # settled: sigma^2 = 1 per entry, mu = 0
        blocks[1].weight.grad = mu + noise[1]                  # learning: |mu|^2 = sigma^2 -> 1/2
        blocks[2].weight.grad = mu + 0.1 * noise[2]            # pulled one way: ~1
        rec.record(step)
    st = GradStats.from_dict(rec.report())
    assert abs(st.signal[0]) < 0.02 and st.signal[1] == pytest.approx(0.5, abs=0.03) and st.signal[2] > 0.98
    assert st.energy[:3] == pytest.approx([1600, 3200, 1616], rel=0.05)
    assert st.signal[3] == 0 and st.energy[3] == 0
    assert st.signal_prev is not None and abs(st.signal_prev[0]) < 0.02


def test_penalty_from_the_signal_charges_only_what_still_learns():
    """The consistent share of the prefix's gradient energy, counted from the louder of the last two intervals,
    plus ANNEAL of its noise share: a settled layer is cheap when it holds little of the gradient, not free."""
    from parsl_bft.planner.freeze import ANNEAL

    settled = {"prev": [1, 1, 1, 1], "now": [1, 1, 1, 1], "signal": [0.0, -0.03, 0.5, 0.8],
               "signal_prev": [-0.02, 0.004, 0.4, 0.9], "energy": [1.0, 3.0, 36.0, 60.0]}

    def cost(rho: float, e: float) -> float:
        return (rho + ANNEAL * (1 - rho)) * e / 100
    pen = penalty_curve(GradStats.from_dict(settled), 4)
    assert pen[:3] == pytest.approx([0, cost(0, 1), cost(0, 1) + cost(0.004, 3)])   # layer 1: the louder 0.004
    assert pen[3] == pytest.approx(pen[2] + cost(0.5, 36))
    once = {**settled, "signal_prev": [0.6, 0.6, 0.4, 0.9]}            # quiet in one interval only: still costly
    assert penalty_curve(GradStats.from_dict(once), 4)[2] == pytest.approx(cost(0.6, 1) + cost(0.6, 3))
    # all noise, most of the gradient in the prefix (the transformer): costly though nothing shows a signal
    noisy = {**settled, "signal": [-0.05] * 4, "signal_prev": [-0.04] * 4, "energy": [2.0, 50.0, 25.0, 23.0]}
    assert penalty_curve(GradStats.from_dict(noisy), 4)[3] == pytest.approx(ANNEAL * 0.77)
    unknown = {**settled, "signal": [float("nan"), 0.0, 0.0, 0.0]}     # frozen before it had statistics
    assert penalty_curve(GradStats.from_dict(unknown), 4)[1] == 1.0
    plan = Planner(method="dp").plan([job(stats=settled)], NODES)
    assert plan.freeze == {"a": 2}                                      # settled prefix: frozen
    assert Planner(method="dp").plan([job(stats=once)], NODES).freeze == {"a": 0}


def test_runtime_feedback_charges_the_budget_and_follows_the_curve():
    from parsl_bft.execution.layers import fragment_reported, job_layers

    lt = job_layers("a", "images", 32, {"n": 64, "width": 8}, CURVE)
    assert lt.profile.n_layers == 4 and 0 < lt.profile.shares[2][0] < 1 and 0 < lt.profile.shares[2][1] < 1
    state = JobState(JobSpec("a", "a", 1, 2, 0, 0, 1000.0, freeze="auto", accuracy_budget=0.01), CURVE, layers=lt,
                     grad_stats=SETTLED, freeze=3, samples_done=200.0)
    state.curve = ScalingCurve("a", {1: 50.0})
    fragment_reported(state, SimpleNamespace(samples_done=600, grad_stats=SETTLED))     # what it reads of a result
    pen = penalty_curve(GradStats.from_dict(SETTLED), 4)[3]
    assert state.accuracy_spent == pytest.approx(pen * 0.4) and state.layers.curve is state.curve


# --- simulator ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_simulated_cluster_finishes_sooner_with_freezing_and_within_budgets(tmp_path):
    """Eight jobs on a dedicated 4-node cluster, through the CLI's default path (its ceiling replay included):
    freezing shortens the average JCT, every job stays within its budget, and --no-freeze replays exactly the
    jobs-without-freezing result."""
    import json

    from parsl_bft.cli import main
    from parsl_bft.sim.freezing import synthetic_layers

    jobs = [JobSpec(f"j{i}", "m", 1, 4, 5.0, 5.0, 2e5, submit=100.0 * i, freeze="auto" if i % 2 else "off",
                    accuracy_budget=0.01 if i % 2 else 0.0) for i in range(8)]
    write_jobs_csv(tmp_path / "x.jobs.csv", jobs)
    prof = synthetic_layers("m")
    write_scaling_csv(tmp_path / "x.scaling.csv", [("m", n, CURVE.rate(n)) for n in (1, 2, 4)]
                      + [("m", 1, CURVE.rate(1) * 1.2, 1, prof.n_layers, *prof.shares[1])])
    out = {}
    for flag in ([], ["--no-freeze"]):
        path = tmp_path / f"r{len(flag)}.json"
        assert main(["simulate", "--cluster", "4", "--jobs", str(tmp_path / "x.jobs.csv"), "--planner", "dp",
                     "--objective", "jct", "--tfwd", "300", "--json", str(path), *flag]) == 0
        out[bool(flag)] = json.loads(path.read_text())
    on, off = out[False], out[True]
    assert on["jobs_finished"] == off["jobs_finished"] == 8
    assert on["ceiling_e_used"] >= on["e_used"] - 1e-9      # the ceiling replay keeps the freeze levels
    assert on["frozen_share"] > 0.1 and off["frozen_share"] == 0
    assert on["avg_jct_s"] < off["avg_jct_s"] and on["budget_violations"] == 0
    assert all(j["accuracy_spent"] <= 0.01 for j in on["jobs"])
    assert max(j["freeze_level"] for j in on["jobs"] if j["name"] in ("j0", "j2", "j4", "j6")) == 0


def test_the_budget_outranks_levels_only_going_up():
    """Frozen at 3 with its penalty grown past what the budget has left: the planner takes it down to the highest
    level that fits, even without unfreeze, and even though the restart costs more than the gain."""
    j = job(budget=0.02, level=3)                  # SETTLED: penalty(3) = 0.25, 0 below
    j.samples_done, j.nodes, j.accuracy_spent = 5e5, tuple(NODES), 0.015     # 0.015 + 0.25 * 0.5 > 0.02
    plan = Planner(method="dp", t_fwd=0.01).plan([j], NODES)
    assert plan.freeze["a"] == 2 and plan.rescale_cost["a"] > 0


def test_yaml_job_sets_declare_freezing(tmp_path):
    from parsl_bft.jobs import read_jobset_yaml

    write_scaling_csv(tmp_path / "s.csv", [("m", 1, 100.0), ("m", 1, 150.0, 1, 3, 0.5, 0.2)])
    (tmp_path / "j.yaml").write_text(
        "jobs:\n  - {name: a, model: m, min_nodes: 1, max_nodes: 2, t_up: 1, t_down: 1, samples: 100,"
        " freeze: auto, accuracy_budget: 0.005, unfreeze: yes}\n"
        "  - {name: b, model: m, min_nodes: 1, max_nodes: 2, t_up: 1, t_down: 1, samples: 100, freeze: off}\n"
        "scaling_csv: s.csv\n")
    js = read_jobset_yaml(tmp_path / "j.yaml")
    assert [(j.freeze, j.accuracy_budget, j.unfreeze) for j in js.jobs] == [("auto", 0.005, True), ("off", 0, False)]
    assert js.layers["m"].points == {(1, 1): 150.0}
    (tmp_path / "j.yaml").write_text(
        "jobs:\n  - {name: a, model: m, min_nodes: 1, max_nodes: 2, t_up: 1, t_down: 1, samples: 100,"
        " freeze: auto, accuracy_budget: -1}\nscaling_csv: s.csv\n")
    with pytest.raises(InputError, match="accuracy_budget"):
        read_jobset_yaml(tmp_path / "j.yaml")


@pytest.mark.parametrize("n_layers", [4, 8, 12])
def test_a_replay_freezes_models_of_any_depth(n_layers):
    """The replay's gradient statistics have the model's own number of layers: a 4-layer model (the built-in
    images workload) was never frozen, its penalty curve being built for 8."""
    from parsl_bft.sim import simulate
    from parsl_bft.sim.freezing import synthetic_layers
    from parsl_bft.sim.philly import dedicated_cluster

    jobs = [JobSpec(f"j{i}", "m", 1, 4, 5.0, 5.0, 2e5, submit=100.0 * i, freeze="auto", accuracy_budget=0.01)
            for i in range(4)]
    js = JobSet(jobs, {"m": CURVE}, {"m": synthetic_layers("m", n_layers)})
    m = simulate(dedicated_cluster(4, 0.0, 1e7), js, Planner(method="dp", objective="jct", t_fwd=300.0),
                 until_done=True).metrics()
    assert m["jobs_finished"] == 4 and m["frozen_share"] > 0.05, m["frozen_share"]


def test_the_speedup_table_is_the_model_and_the_measured_points():
    """The planner's lookup table gives what the model computes, measured points as measured, beyond its first
    size too (it grows), and the penalty of one report is computed once and never changed."""
    from parsl_bft.planner.freeze import job_penalty

    lt = profile({(2, 2): 250.0})
    ns = np.arange(0, 200)
    for f in (1, 2, 3):
        assert lt.speedups(ns, f) == pytest.approx(lt._computed(ns, f))
        assert [lt.speedup(int(n), f) for n in (0, 1, 2, 150)] == pytest.approx(list(lt._computed(
            np.array([0, 1, 2, 150]), f)))
    assert lt.rate(2, 2) == pytest.approx(250.0)
    pen = job_penalty(SETTLED, 4)
    assert pen is job_penalty(SETTLED, 4)
    assert list(pen) == pytest.approx(list(penalty_curve(GradStats.from_dict(SETTLED), 4)))
    assert not pen.flags.writeable and list(job_penalty(None, 4)) == [0, 1, 1, 1]


def test_a_simulated_job_reports_once_per_interval():
    """Between reports the planner sees the same statistics (the last complete interval's), as from fragments."""
    from parsl_bft.sim.freezing import synthetic_profile

    p = synthetic_profile(JobSpec("j", "m", 1, 4, 5.0, 5.0, 2e5, freeze="auto", accuracy_budget=0.01))
    assert p.stats(0.01) is None and p.stats(0.039) is None
    assert p.stats(0.041) is p.stats(0.059) is not p.stats(0.061)
    assert p.stats(0.041)["signal"] != p.stats(0.061)["signal"]


def test_a_short_job_is_not_restarted_for_a_level_it_cannot_keep(shared_data):
    """A job of ~50 s on 16 GPUs, alone on a dedicated cluster (Philly draw 4's philly0032): a restart costs 15 s,
    a third of it. It used to switch to a higher level near its end (the speed-up valued over the whole
    look-ahead, not its last seconds), lose the restart as samples, find the level over budget for the work now
    left, switch back, and never finish (the replay ran for days of simulated time)."""
    from parsl_bft.sim import simulate
    from parsl_bft.sim.freezing import synthetic_layers
    from parsl_bft.sim.philly import dedicated_cluster

    curves = read_scaling_csv(shared_data / "jobs" / "imagenet_mix.scaling.csv")
    spec = JobSpec("philly0032", "DenseNet", 1, 16, 15.0, 15.0, 1125998.8, freeze="auto", accuracy_budget=0.005)
    steps = []

    def bounded(_: float) -> None:
        steps.append(1)
        if len(steps) > 5000:
            raise AssertionError(f"ran out of steps at step {len(steps)}: the job is still not done")
    res = simulate(dedicated_cluster(48, 0.0, 3 * 86400.0),
                   JobSet([spec], {"DenseNet": curves["DenseNet"]}, {"DenseNet": synthetic_layers("DenseNet")}),
                   Planner(method="dp", objective="jct", t_fwd=300.0), until_done=True, max_concurrent=4,
                   progress=bounded)
    (row,) = res.job_rows()
    alone = 1125998.8 / curves["DenseNet"].rate(16)
    assert row["finished_at"] is not None and row["finished_at"] < alone + 2 * 15.0
    assert row["rescales"] <= 1 and row["accuracy_spent"] <= 0.005


def test_a_pause_charged_as_lost_samples_does_not_untrain_the_budget():
    """The simulator charges a restart as samples taken off progress; the budget's remaining share is what the
    model has never trained on, so the charge cannot push a frozen level over budget."""
    from parsl_bft.control import ActiveJob

    a = ActiveJob(job(), 0.0)
    a.state.samples_done = 9e5
    a.charge(3e5, reclaim=False)
    assert a.state.remaining == pytest.approx(4e5) and a.state.untrained_share == pytest.approx(0.1)
