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
