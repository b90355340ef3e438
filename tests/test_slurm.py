"""Slurm back end: parsers on recorded output, the provider on canned commands, and a real local Slurm."""
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from parsl.jobs.states import JobState

from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider, find_holes
from parsl_bft.execution.slurm.commands import (parse_sacct_c, parse_sbatch, parse_sinfo_nodes,
                                                parse_squeue_pending, parse_test_only)

ROOT = Path(__file__).resolve().parent.parent

# recorded on the local 8-node cluster (tools/local-slurm.sh): a 6-node job running, an 8-node job waiting
SINFO = "n1|alloc\nn2|alloc\nn3|alloc\nn4|alloc\nn5|alloc\nn6|alloc\nn7|plnd\nn8|plnd\n"
SQUEUE_PD = "2|2026-11-21T18:19:55|8|debug\n"
TEST_ONLY = "sbatch: Job 3 to start at 2026-11-21T18:18:57 using 4 processors on nodes n7 in partition debug\n"
SACCT_C = ("JobId=7 UserId=root(0) GroupId=root(0) Name=pilot JobState=TIMEOUT Partition=debug TimeLimit=1 "
           "StartTime=2026-11-21T18:20:00 EndTime=2026-11-21T18:21:03 NodeList=n7 NodeCnt=1\n"
           "JobId=8 UserId=root(0) GroupId=root(0) Name=pilot JobState=CANCELLED Partition=debug TimeLimit=1\n")


def test_parsers_on_recorded_output():
    nodes = parse_sinfo_nodes(SINFO)
    assert [n.name for n in nodes if n.usable] == ["n7", "n8"]
    assert not parse_sinfo_nodes("n1|idle*\n")[0].usable          # not responding
    pend = parse_squeue_pending(SQUEUE_PD)
    assert pend[0].job_id == "2" and pend[0].nodes == 8
    assert pend[0].planned_start == datetime.fromisoformat("2026-11-21T18:19:55").timestamp()
    assert parse_squeue_pending("5|N/A|2|debug\n")[0].planned_start is None
    assert parse_sbatch("Submitted batch job 42\n") == "42"
    with pytest.raises(ValueError, match="no job id"):
        parse_sbatch("sbatch: error: invalid partition\n")
    start, where = parse_test_only(TEST_ONLY)
    assert where == "n7" and start == datetime.fromisoformat("2026-11-21T18:18:57").timestamp()
    assert [(r.job_id, r.state) for r in parse_sacct_c(SACCT_C)] == [("7", "TIMEOUT"), ("8", "CANCELLED")]


class Canned:
    """A runner answering each command from recorded output and logging what was asked."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, argv):
        self.calls.append(argv)
        for prefix, ans in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return ans() if callable(ans) else ans
        return 0, "", ""


def test_holes_and_pilot_scripts_on_canned_slurm(tmp_path):
    start = datetime.fromisoformat("2026-11-21T18:19:55").timestamp()
    run = Canned({"sinfo": (0, SINFO, ""), "squeue -h -t PD": (0, SQUEUE_PD, ""),
                  "sbatch": (0, "Submitted batch job 11\n", "")})
    cmd = SlurmCommands(run)
    holes = find_holes(cmd, "debug")
    assert [h.node for h in holes] == ["n7", "n8"] and all(h.until == start for h in holes)
    prov = SlurmPilotProvider("debug", qos="standby", commands=cmd, script_dir=str(tmp_path), notice_s=45)
    assert prov.walltime_minutes(now=start - 10 * 60 - 5) == 10        # the hole: 10 whole minutes
    assert prov.walltime_minutes(now=start - 30) == 1                  # never below --time-min
    jid = prov.submit("process_worker_pool.py --foo", 1, "pilot")
    assert jid == "11"
    script = next(tmp_path.glob("pilot.*.sh")).read_text()
    for opt in ("--nodes=1", "--time-min=1", "--signal=B:USR1@45", "--qos=standby", "--partition=debug"):
        assert f"#SBATCH {opt}" in script
    assert "process_worker_pool.py --foo" in script and "trap" in script


def test_pilot_states_never_failed_for_reclaims(tmp_path):
    run = Canned({"squeue -h -t all": (0, "11|RUNNING|n7\n12|PENDING|(Resources)\n", ""),
                  "sacct -c": (0, SACCT_C, "")})
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), script_dir=str(tmp_path), max_pending_s=60)
    prov.submitted.update({"11": time.time(), "12": time.time(), "7": time.time(), "8": time.time()})
    st = {j: s.state for j, s in zip(["11", "12", "7", "8", "99"], prov.status(["11", "12", "7", "8", "99"]))}
    assert st == {"11": JobState.RUNNING, "12": JobState.PENDING, "7": JobState.TIMEOUT, "8": JobState.SCALED_IN,
                  "99": JobState.MISSING}
    prov.submitted["12"] = time.time() - 120                            # pending too long: withdrawn
    st = prov.status(["12"])[0]
    assert st.state == JobState.SCALED_IN and "withdrawn" in st.message
    assert any(c[0] == "scancel" and "12" in c for c in run.calls)


def test_bad_provider_config():
    with pytest.raises(ValueError, match="walltime bounds"):
        SlurmPilotProvider(walltime_min_min=5, walltime_max_min=2)


# --- a real Slurm -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.fail("the slurm tests need root to install and start a local Slurm (CI runs as root)")
    env = {**os.environ, "SLURM_LOCAL_FRESH": "1", "SLURM_LOCAL_AUTH": "none"}
    r = subprocess.run([str(ROOT / "tools" / "local-slurm.sh"), "restart"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    os.environ["SLURM_CONF"] = "/tmp/local-slurm/etc/slurm.conf"
    yield SlurmCommands()
    subprocess.run(["scancel", "--user", "root"], capture_output=True)


def wait_for(pred, timeout, step=1.0):
    t = time.time()
    while time.time() - t < timeout:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_pilots_soak_a_real_backfill_hole_without_delaying_facility_jobs(slurm, tmp_path):
    def sbatch(*args):
        return subprocess.run(["sbatch", "--parsable", "-p", "debug", *args], capture_output=True, text=True,
                              check=True).stdout.strip().split(";")[0]
    big = sbatch("-N", "6", "-t", "3", "--wrap", "sleep 150")       # the facility's workload ...
    head = sbatch("-N", "8", "-t", "1", "--wrap", "sleep 5")        # ... and a job waiting behind it
    assert wait_for(lambda: slurm.jobs([big])[0].state == "RUNNING", 60)
    planned = wait_for(lambda: next((p.planned_start for p in slurm.pending("debug") if p.job_id == head), None), 60)
    assert planned is not None
    holes = wait_for(lambda: find_holes(slurm, "debug"), 30)
    assert sorted(h.node for h in holes) == ["n7", "n8"] and holes[0].until == planned

    prov = SlurmPilotProvider("debug", commands=slurm, script_dir=str(tmp_path), walltime_max_min=30, notice_s=30,
                              poll_s=1)
    assert prov.walltime_minutes() <= 3                              # sized to the hole, not to walltime_max
    pilots = [prov.submit("sleep 600", 1, f"pilot{i}") for i in range(2)]
    running = wait_for(lambda: all(s.state == JobState.RUNNING for s in prov.status(pilots)), 60)
    assert running, [str(s) for s in prov.status(pilots)]
    prov.cancel([pilots[0]])                                         # parsl-bft gives a node back
    assert prov.status([pilots[0]])[0].state == JobState.SCALED_IN
    # the other pilot runs into its time limit: reported TIMEOUT (or SCALED_IN), never FAILED
    end = wait_for(lambda: prov.status([pilots[1]])[0].state not in (JobState.RUNNING, JobState.PENDING), 240, 2)
    assert end is not None and prov.status([pilots[1]])[0].state in (JobState.TIMEOUT, JobState.SCALED_IN)
    # the facility's waiting job was not delayed by the pilots: it starts by its planned time (+ Slurm's ~1 min
    # limit enforcement slack), once the big job ends
    started = wait_for(lambda: slurm.jobs([head])[0].state in ("RUNNING", "COMPLETED", "COMPLETING")
                       if slurm.jobs([head]) else True, 240, 2)
    assert started
    assert time.time() <= planned + 90
    assert not [j for j in slurm.jobs(pilots) if j.state in ("RUNNING", "PENDING")]   # no pilot left
