"""Slurm's compressed host lists (parsl_bft.hostlist): pure parsing, no Slurm."""
import pytest

from parsl_bft.hostlist import expand_hostlist


def test_text_after_a_bracket_several_brackets_and_zero_padding():
    assert expand_hostlist("n[1-2]-ib") == ("n1-ib", "n2-ib")
    assert expand_hostlist("r[1-2]n[09-10],gpu07") == ("r1n09", "r1n10", "r2n09", "r2n10", "gpu07")
    assert expand_hostlist("a01n[01,03],(null)") == ("a01n01", "a01n03")


def test_what_slurm_prints_for_none_is_no_node():
    assert expand_hostlist("") == () and expand_hostlist("(null)") == () and expand_hostlist("N/A") == ()


def test_the_slurm_back_end_reads_host_lists_through_the_same_function():
    from parsl_bft.execution.slurm.commands import expand_hostlist as slurms
    assert slurms is expand_hostlist


def test_a_malformed_range_is_an_error():
    with pytest.raises(ValueError, match="bad host range"):
        expand_hostlist("n[a-3]")


def test_a_host_list_beyond_any_machine_is_refused_before_it_is_expanded():
    """n[1-1000000000] in a topology.conf or a site file's groups grew until memory ran out."""
    for text in ("n[1-1000000000]", "r[1-2000]n[1-2000]"):
        with pytest.raises(ValueError, match="beyond any machine"):
            expand_hostlist(text)
    assert len(expand_hostlist("r[1-1000]n[1-1000]")) == 1_000_000


def test_a_topologys_host_lists_are_capped_in_total_before_any_is_expanded(monkeypatch):
    """60 groups of a million names each (a 1.7 KB site file) passed the cap per list and took `sites validate`
    to 3.8 GB and a MemoryError; the same in a topology.conf. Now one line, before anything is expanded."""
    from parsl_bft import topology
    from parsl_bft.topology import TopologyError, parse_slurm_topology, topology_from_dict
    groups = {f"g{i}": f"g{i}n[1-1000000]" for i in range(60)}
    real, expanded = topology.expand_hostlist, []
    monkeypatch.setattr(topology, "expand_hostlist", lambda text: expanded.append(text) or real(text))
    with pytest.raises(TopologyError, match=r"site: its host lists name more than 1,000,000 hosts in total"):
        topology_from_dict({"groups": groups}, source="site")
    conf = "".join(f"SwitchName=s{i} Nodes=s{i}n[1-600000]\n" for i in range(2))
    with pytest.raises(TopologyError, match=r"conf: its host lists name more than 1,000,000 hosts in total"):
        parse_slurm_topology(conf, source="conf")
    assert expanded == []                       # counted, not expanded
    assert len(topology_from_dict({"groups": {"a": "n[1-3]", "b": ["m1", "m2"]}}).groups) == 5
    assert len(parse_slurm_topology("SwitchName=s0 Nodes=n[1-2]\nSwitchName=top Switches=s0\n").groups) == 2
