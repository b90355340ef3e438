"""Topology sources, each on recorded or canned output."""
from __future__ import annotations

from pathlib import Path

import pytest

from parsl_bft.topology import (
    Topology,
    TopologyError,
    hostname_topology,
    load_topology,
    parse_pbsnodes_topology,
    parse_slurm_topology,
    topology_from_dict,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "topology"


def test_scontrol_show_topology_recorded_on_local_slurm():
    t = parse_slurm_topology((DATA / "scontrol_show_topology_3sw.txt").read_text())
    assert [t.group(f"n{i}") for i in range(1, 9)] == ["s0"] * 3 + ["s1"] * 3 + ["s2"] * 2
    assert t.span(["n1", "n3"]) == 1 and t.span(["n3", "n4", "n8"]) == 3
    assert t.by_group(["n8", "n1", "n2"]) == {"s2": ["n8"], "s0": ["n1", "n2"]}
    with pytest.raises(TopologyError, match="n9"):
        t.group("n9")


def test_topology_conf_same_parser_and_errors():
    t = parse_slurm_topology("# leafs\nSwitchName=a Nodes=r1n[01-02]\nSwitchName=b Nodes=r2n01,x\n"
                             "SwitchName=top Switches=a,b\n")
    assert t.groups == {"r1n01": "a", "r1n02": "a", "r2n01": "b", "x": "b"}
    with pytest.raises(TopologyError, match="n2 is under leaf switches a and b"):
        parse_slurm_topology("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n2\n")
    with pytest.raises(TopologyError, match="topology/tree"):
        parse_slurm_topology("SwitchName=top Switches=a,b\n")
    with pytest.raises(TopologyError, match="line 1"):
        parse_slurm_topology("Nodes=n1\n")


def test_pbsnodes_placement_sets():
    text = (DATA / "pbsnodes_tiers.json").read_text()
    t = parse_pbsnodes_topology(text)                  # tier0 (rack) is preferred over tier1 (dragonfly group)
    assert t.group("x3001c0s1b1n0") == "x3001-g0" and t.group("x3105c0s7b1n0") == "x3105-g1"
    assert t.gpus_per_node == 4
    g = parse_pbsnodes_topology(text, key="tier1")
    assert g.span(["x3001c0s1b0n0", "x3002c0s7b0n0"]) == 1
    with pytest.raises(TopologyError, match=r"resources_available.switch"):
        parse_pbsnodes_topology(text, key="switch")
    with pytest.raises(TopologyError, match="not pbsnodes"):
        parse_pbsnodes_topology("[]")


def test_hostname_rules_summit_and_cray():
    t = hostname_topology()
    assert t.group("a01n01") == "a01" and t.group("c05n18") == "c05"
    assert t.group("x3001c0s1b0n0") == "x3001"
    with pytest.raises(TopologyError, match="nid00012"):
        t.group("nid00012")
    assert hostname_topology(singletons=True).group("nid00012") == "nid00012"
    with pytest.raises(TopologyError, match="no \\(\\?P<group>"):
        hostname_topology(r"^(\w+)$")


def test_site_section_and_spec(tmp_path):
    doc = {"groups": {"sw0": "n[1-4]", "sw1": ["n5", "n6"]}, "gpus_per_node": 4, "inter_gbps": 5}
    t = topology_from_dict(doc)
    assert t.group("n4") == "sw0" and t.group("n6") == "sw1" and t.gpus_per_node == 4 and t.inter_gbps == 5.0
    with pytest.raises(TopologyError, match=r"unknown field.*switches"):
        topology_from_dict({"switches": {}})
    with pytest.raises(TopologyError, match="exactly one"):
        topology_from_dict({"gpus_per_node": 2})
    with pytest.raises(TopologyError, match="n2 is in groups a and b"):
        topology_from_dict({"groups": {"a": "n[1-2]", "b": "n2"}})
    with pytest.raises(TopologyError, match="bandwidths"):
        topology_from_dict({"hostname": "hostname-rack", "inter_gbps": 0})
    site = tmp_path / "site.yaml"
    site.write_text("name: x\ntopology:\n  hostname: hostname-rack\n  gpus_per_node: 6\n")
    assert load_topology(str(site)).gpus_per_node == 6
    assert load_topology(str(DATA / "scontrol_show_topology_3sw.txt"), gpus_per_node=2).gpus_per_node == 2
    assert load_topology(str(DATA / "pbsnodes_tiers.json")).group("x3002c0s7b0n0") == "x3002-g0"
    assert load_topology("hostname:^(?P<group>r\\d+)-").group("r7-12") == "r7"
    with pytest.raises(TopologyError, match="not a file"):
        load_topology("no-such-thing")


@pytest.mark.parametrize("groups, says", [
    ("{sw0: 5}", "group 'sw0': its nodes must be a hostlist"), ("[n1, n2]", "'groups' must map each group"),
    ("{sw0: [n1, null]}", "group 'sw0': its nodes must be"), ("{}", "'groups' must map each group")])
def test_a_malformed_groups_section_is_a_message_not_a_traceback(tmp_path, capsys, groups, says):
    """A site file's ``topology.groups`` of the wrong shape (a YAML slip) is refused by ``sites validate``
    with the field named; it raised a TypeError / AttributeError, and ``groups: {}`` passed."""
    from parsl_bft.cli import main
    site = tmp_path / "site.yaml"
    site.write_text(f"name: x\nscheduler: local\nnode: {{cores: 1}}\ntopology: {{groups: {groups}}}\n")
    assert main(["sites", "validate", str(site)]) == 1
    assert says in capsys.readouterr().err


def test_constructor_checks():
    with pytest.raises(TopologyError, match="gpus_per_node"):
        Topology(gpus_per_node=0)


def test_pbsnodes_topology_of_another_shape_is_a_topology_error():
    with pytest.raises(TopologyError, match="'nodes' is not an object of nodes by name"):
        parse_pbsnodes_topology('{"nodes": ["n1"]}')
