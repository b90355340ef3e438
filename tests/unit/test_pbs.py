"""PBS Pro back end on PBS-format command output (no PBS server installs here)."""
import time
from datetime import datetime
from pathlib import Path

import pytest
from fakes import PBS_NODES, PBS_QSTAT, canned_pbs
from parsl.jobs.states import JobState

from parsl_bft.execution.pbs import PBSCommands, PBSPilotProvider
from parsl_bft.execution.pbs.commands import PBSError, parse_pbsnodes, parse_qstat, parse_qsub, parse_user_caps
from parsl_bft.execution.pilot import PilotShape

NODES, QSTAT = PBS_NODES, PBS_QSTAT


def test_parsers():
    nodes = parse_pbsnodes(NODES)
    assert [n.name for n in nodes if n.usable] == ["x3001c0s1b1n0", "x3001c0s7b0n0"]
    assert nodes[0].ngpus == 4 and nodes[0].ncpus == 64
    jobs = {j.job_id: j for j in parse_qstat(QSTAT)}
    assert jobs["1002.polaris-pbs-01"].estimated_start == 1795291800 and jobs["1002.polaris-pbs-01"].nodes == 3
    assert jobs["1002.polaris-pbs-01"].walltime == 7200 and jobs["1004.polaris-pbs-01"].walltime is None
    assert jobs["1004.polaris-pbs-01"].exit_status == 271
    run = jobs["1001.polaris-pbs-01"]                           # where a running job is, and until when
    assert run.hosts == ("x3001c0s1b0n0",)
    assert run.end == datetime(2026, 11, 21, 17, 40).timestamp() + 3600
    assert parse_qsub("1010.polaris-pbs-01\n") == "1010.polaris-pbs-01"
    with pytest.raises(ValueError, match="no job id"):
        parse_qsub("qsub: Unknown queue\n")


def test_holes_and_pilot_script(tmp_path):
    calls = []
    cmd = PBSCommands(canned_pbs(calls))
    prov = PBSPilotProvider("preemptable", account="proj", select="1:ncpus=64:ngpus=4", commands=cmd,
                            script_dir=str(tmp_path), scheduler_options=["-l filesystems=home:eagle"])
    prov.clock = lambda: 1795291800 - 30 * 60          # the recorded queue, 30 minutes before its planned start
    holes = prov.current_holes()
    assert [h.node for h in holes] == ["x3001c0s1b1n0", "x3001c0s7b0n0"] and holes[0].until == 1795291800
    assert prov.walltime_minutes(now=1795291800 - 25 * 60) == 25
    m = prov.walltime_minutes()
    assert prov.submit("process_worker_pool.py", 1, "pilot") == "1010.polaris-pbs-01"
    script = next(tmp_path.glob("pilot.*.sh")).read_text()
    for line in ("#PBS -q preemptable", "#PBS -l select=1:ncpus=64:ngpus=4",
                 f"#PBS -l walltime={m // 60:02d}:{m % 60:02d}:00",
                 "#PBS -A proj", "#PBS -l filesystems=home:eagle"):
        assert line in script
    assert any(c[0] == "qsub" for c in calls)
    # a queued job planned to start within the lead time claims its nodes back (estimated.exec_vnode)
    assert prov.claimed(60, now=1795291800 - 30) == {"x3001c0s1b0n0", "x3001c0s1b1n0", "x3001c0s7b0n0"}
    assert prov.claimed(60, now=1795291800 - 600) == set()
    assert prov.where(["1001.polaris-pbs-01", "1007.polaris-pbs-01"]) == {
        "1001.polaris-pbs-01": (("x3001c0s1b0n0",), datetime(2026, 11, 21, 17, 40).timestamp() + 3600)}


def test_finished_pilots_are_timeout_or_scaled_in_never_failed_for_reclaims(tmp_path):
    prov = PBSPilotProvider("preemptable", commands=PBSCommands(canned_pbs([])), script_dir=str(tmp_path),
                            max_pending_s=60)
    ids = ["1003.polaris-pbs-01", "1004.polaris-pbs-01", "1005.polaris-pbs-01", "1006.polaris-pbs-01",
           "1007.polaris-pbs-01", "9999.polaris-pbs-01"]
    prov.submitted.update({j: time.time() for j in ids})
    (tmp_path / "1003.polaris-pbs-01.noticed").touch()          # pilot0 ended cleanly at its notice
    st = [s.state for s in prov.status(ids)]
    assert st == [JobState.TIMEOUT, JobState.SCALED_IN, JobState.TIMEOUT, JobState.FAILED, JobState.PENDING,
                  JobState.MISSING]
    prov.submitted["1007.polaris-pbs-01"] = time.time() - 300    # queued too long: withdrawn
    assert prov.status(["1007.polaris-pbs-01"])[0].state == JobState.SCALED_IN


def test_per_user_job_caps_from_queue_and_server():
    queue = '{"Queue": {"preemptable": {"max_queued": "[u:PBS_GENERIC=20]", "max_run": "[u:PBS_GENERIC=10]"}}}'
    server = '{"Server": {"polaris-pbs-01": {"max_queued": "[o:PBS_ALL=5000]"}}}'
    assert parse_user_caps(queue) == [20, 10] and parse_user_caps(server) == [] and parse_user_caps("oops") == []

    def run(argv):
        return (0, queue, "") if "-Q" in argv else (0, server, "") if "-B" in argv else (1, "", "")
    assert PBSCommands(run).job_limit("preemptable") == 10
    assert PBSCommands(lambda argv: (1, "", "qstat: Unknown queue")).job_limit("x") is None


def test_placement_sets_are_asked_once_and_pilots_name_their_host(tmp_path):
    calls = []
    tiers = (Path(__file__).resolve().parents[1] / "data" / "topology" / "pbsnodes_tiers.json").read_text()

    def run(argv):
        calls.append(argv)
        return (0, tiers, "") if argv[0] == "pbsnodes" else canned_pbs([])(argv)
    prov = PBSPilotProvider("preemptable", select="1:ncpus=64:ngpus=4", commands=PBSCommands(run),
                            script_dir=str(tmp_path))
    topo = prov.topology()
    assert topo.group("x3001c0s1b1n0") == "x3001-g0" and prov.topology() is topo and len(calls) == 1
    with prov.pilots(PilotShape(target=("x3001c0s1b1n0",))):
        prov.submit("process_worker_pool.py", 1, "pilot")
    assert "#PBS -l select=1:ncpus=64:ngpus=4:host=x3001c0s1b1n0" in next(tmp_path.glob("pilot.*.sh")).read_text()
    assert prov.targets == {"1010.polaris-pbs-01": ("x3001c0s1b1n0",)}
    # vnodes without a placement set: no topology (logged), and the pilots go wherever PBS puts them
    assert PBSPilotProvider("q", commands=PBSCommands(canned_pbs([])), script_dir=str(tmp_path)).topology() is None


@pytest.mark.parametrize("text", ['{"nodes": ["n1", "n2"]}', '["nodes"]', "not json",
                                  '{"nodes": {"n1": {"resources_available": {"ncpus": "many"}}}}'])
def test_pbsnodes_output_of_another_shape_is_a_scheduler_error(text):
    """A traceback (AttributeError on a list) before; now the pool's own error naming the command."""
    with pytest.raises(PBSError, match=r"^pbsnodes -a failed"):
        parse_pbsnodes(text)


def test_qstat_output_of_another_shape_is_a_scheduler_error():
    with pytest.raises(PBSError, match=r"^qstat -f failed .*'Jobs' is not an object"):
        parse_qstat('{"Jobs": [1, 2]}')
