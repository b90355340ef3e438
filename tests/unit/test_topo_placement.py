"""Idle nodes and the network: the group-level cost model, topology-aware placements, the simulator's rates."""
from __future__ import annotations

import numpy as np
import pytest

from parsl_bft.idle.intervals import IdleIntervals
from parsl_bft.jobs import JobSet, JobSpec
from parsl_bft.planner import JobState, Planner, place
from parsl_bft.planner.netcost import NetworkCost, size_factors
from parsl_bft.planner.topo_placement import BcoPlacement, CompactPlacement, make_placement
from parsl_bft.scaling import ScalingCurve
from parsl_bft.sim import simulate
from parsl_bft.topology import Topology

# groups A = a0..a3, B = b0..b3, C = c0..c1, D = d0..d1
TOPO = Topology({**{f"a{i}": "A" for i in range(4)}, **{f"b{i}": "B" for i in range(4)}, "c0": "C", "c1": "C",
                 "d0": "D", "d1": "D"},
                intra_gbps=10.0, inter_gbps=1.0, source="test")
NET = NetworkCost(TOPO, samples_per_node_iter=100.0, gradient_gb={"m": 1.0}, alpha=0.0, overhead_s=0.0)
LIN = ScalingCurve("m", {1: 100.0, 2: 200.0, 4: 400.0})


def state(name, nodes=(), hi=4):
    return JobState(JobSpec(name, "m", 1, hi, 0.0, 0.0, 1e12, 0.0), LIN, tuple(nodes))


def test_factor_by_hand():
    # 2 nodes at 200 samples/s, 100 samples per node per iteration: 1 s per iteration measured (inside a group);
    # ring share (m/w)(w-1) = 0.5 GB: inside 2 * 0.5 / 10 = 0.1 s (+ 0.5 / 1000 reduce); spread alone (p = 1,
    # alpha 0 -> f = 1) 2 * 0.5 / 1 = 1 s: iteration 1 - 0.1 + 1 = 1.9 s
    f = NET.factors([("m", ("a0", "a1"), 200.0), ("m", ("a2", "b0"), 200.0)])
    assert f[0] == 1.0
    assert f[1] == pytest.approx(1.0 / 1.9, rel=1e-3)
    # a second job spread over the same two groups: p = 2 -> B = 1 / 2, 2 s of ring: 2.9 s each
    both = NET.factors([("m", ("a2", "b0"), 200.0), ("m", ("a3", "b1"), 200.0)])
    assert both == pytest.approx([1.0 / 2.9] * 2, rel=1e-3)
    # one node: nothing to all-reduce
    assert NET.factors([("m", ("a0",), 100.0)]).tolist() == [1.0]


def test_compact_grows_into_fewest_groups_and_shrinks_out_of_small_ones():
    p = CompactPlacement(TOPO)
    free = ["c0", "a0", "b0", "b1", "b2", "c1"]
    assert sorted(p.grow(state("j"), free, 3, {})) == ["b0", "b1", "b2"]
    assert sorted(p.grow(state("j", ["c0"]), ["c1", "b0", "b1"], 1, {})) == ["c1"]      # its own group first
    assert p.release(state("j", ["a0", "a1", "b0"]), 1, {}) == ["b0"]


def test_bco_small_jobs_fill_fragments_large_jobs_avoid_contended_groups():
    p = BcoPlacement(TOPO)
    free = ["a0", "a1", "a2", "a3", "c0", "c1", "b3"]
    # 2 nodes fit C exactly (the tightest fit): A stays whole for a bigger job
    assert sorted(p.grow(state("s"), free, 2, {})) == ["c0", "c1"]
    # a 5-node job fits no group; B is used by a spread job, so A and C (fewest groups reaching 5) are taken
    p.observe({"x": ("b0", "d0"), "y": ("b1", "b2")})
    got = p.grow(state("big", hi=8), free, 5, {})
    assert "b3" not in got and len(got) == 5
    sizes = {"s": 2, "big": 5}
    assert [j.name for j in p.grow_order([state("big"), state("s")], sizes)] == ["s", "big"]
    with pytest.raises(ValueError, match="lambda"):
        BcoPlacement(TOPO, lam=0.5)
    with pytest.raises(ValueError, match="needs a topology"):
        make_placement("sjf-bco", None)


def test_place_runs_growing_jobs_in_the_placements_order():
    pool = ["a0", "c0", "a1", "c1", "a2", "a3"]
    jobs = [state("big"), state("small")]
    alloc = place(jobs, {"big": 4, "small": 2}, pool, BcoPlacement(TOPO))
    assert sorted(alloc["small"]) == ["c0", "c1"] and sorted(alloc["big"]) == ["a0", "a1", "a2", "a3"]
    # topology-blind: the first job takes the first free nodes, the second what is left
    blind = place(jobs, {"big": 4, "small": 2}, pool, make_placement("oblivious", None))
    assert TOPO.span(blind["big"]) == 2


def test_planner_values_see_the_spread():
    f = size_factors(NET, [state("j", ["c0"])], ["c0", "c1", "a0", "a1", "a2", "a3"])
    v = f(state("j", ["c0"]), np.array([0, 1, 2, 3]))
    assert v[:3].tolist() == [1.0, 1.0, 1.0] and v[3] < 1.0       # 3 nodes must leave group C


def _interleaved():
    # groups A and B; the pool order alternates them, so a blind placement spreads every 2-node job
    names = ["a0", "b0", "a1", "b1"]
    return IdleIntervals.build(names, [0, 1, 2, 3], [0] * 4, [1000] * 4, t0=0, t1=1000)


def test_simulator_charges_communication_and_placement_shows_in_e_idle():
    topo = Topology({"a0": "A", "a1": "A", "b0": "B", "b1": "B"}, intra_gbps=10.0, inter_gbps=1.0)
    net = NetworkCost(topo, samples_per_node_iter=100.0, gradient_gb={"m": 1.0}, overhead_s=0.0)
    js = JobSet([JobSpec("j1", "m", 2, 2, 0.0, 0.0, 1e12, 0.0), JobSpec("j2", "m", 2, 2, 0.0, 0.0, 1e12, 0.0)],
                {"m": LIN})
    res = {}
    for name in ("oblivious", "compact", "sjf-bco"):
        planner = Planner(method="dp", placement=make_placement(name, topo),
                          network=None if name == "oblivious" else net)
        res[name] = simulate(_interleaved(), js, planner, network=net).metrics()
    plain = simulate(_interleaved(), js, Planner(method="dp")).metrics()
    assert res["oblivious"]["net_factor"] < 1.0 and res["oblivious"]["e_idle"] < plain["e_idle"]
    for name in ("compact", "sjf-bco"):
        assert res[name]["net_factor"] == 1.0
        assert res[name]["e_idle"] == pytest.approx(plain["e_idle"])
        assert res[name]["e_idle"] > res["oblivious"]["e_idle"]


def test_site_file_topology_section_reaches_the_planner(tmp_path):
    from parsl_bft.execution.session import make_planner
    from parsl_bft.sites import SiteError, load_site

    base = "name: t\nscheduler: slurm\npartition: p\nnode: {cores: 4, gpus: 4}\n"
    good = tmp_path / "good.yaml"
    good.write_text(base + "topology:\n  groups: {s0: 'n[1-4]', s1: 'n[5-8]'}\n  gpus_per_node: 4\n")
    planner = make_planner(load_site(good))
    assert isinstance(planner.placement, BcoPlacement) and planner.placement.topology.group("n6") == "s1"
    assert planner.network.topology.gpus_per_node == 4
    # a node the site file does not list (added later): its own group, the plan goes on
    jobs = [state("j")]
    plan = planner.plan(jobs, ["n1", "n2", "n9"])
    assert sorted(plan.allocation["j"]) == ["n1", "n2", "n9"] and planner.placement.topology.group("n9") == "n9"
    assert make_planner(load_site(_write(tmp_path, "plain.yaml", base))).network is None
    with pytest.raises(SiteError, match=r"topology.*n2 is in groups s0 and s1"):
        load_site(_write(tmp_path, "bad.yaml", base + "topology:\n  groups: {s0: 'n[1-2]', s1: n2}\n"))


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p
