"""How a pilot ends: never requeued, its TERM trap gives the worker the partition's GraceTime (or the site's
grace_seconds) to save before killing it, and a pilot the pool gives back ends itself with exit 0 (COMPLETED in
Slurm's accounting, not CANCELLED). The traps run here in bash, as the batch script runs them."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsl_bft.execution.pbs import PBSPilotProvider
from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import alive, wait_for

# scontrol show partition -o backfill on tools/local-slurm.sh (one line; trimmed)
PARTITION = ("PartitionName=backfill AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO "
             "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=10 Hidden=NO "
             "MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-8] "
             "PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=EXCLUSIVE PreemptMode=CANCEL\n")


def _provider(tmp_path, answers=None, **kw):
    calls = []

    def run(argv):
        calls.append(argv)
        for prefix, ans in (answers or {}).items():
            if " ".join(argv).startswith(prefix):
                return ans
        return 0, "", ""
    return SlurmPilotProvider("backfill", commands=SlurmCommands(run), script_dir=str(tmp_path), **kw), calls


def test_the_pilot_script_is_never_requeued_and_waits_the_partitions_grace(tmp_path):
    prov, calls = _provider(tmp_path, {"scontrol show partition": (0, PARTITION, "")})
    script = prov.script("worker", "parsl.bft", 10)
    assert "#SBATCH --no-requeue" in script.splitlines()
    assert "for _ in $(seq 50); do group_alive $CHILD" in script and "sleep 3;" not in script   # 10 s, 5 looks a second
    prov.script("worker", "parsl.bft", 10)
    assert sum(c[:2] == ["scontrol", "show"] for c in calls) == 1          # asked once
    site_says, calls = _provider(tmp_path, {"scontrol show partition": (0, PARTITION, "")}, grace_s=25)
    assert "$(seq 125)" in site_says.script("worker", "parsl.bft", 10) and calls == []   # the site's word
    unknown, _ = _provider(tmp_path, {"scontrol show partition": (1, "", "slurm_load_partitions: error")})
    assert "$(seq 15)" in unknown.script("worker", "parsl.bft", 10)
    zero, _ = _provider(tmp_path, {"scontrol show partition": (0, PARTITION.replace("GraceTime=10", "GraceTime=0"),
                                                               "")})
    assert "$(seq 15)" in zero.script("worker", "parsl.bft", 10)
    pbs = PBSPilotProvider("workq", script_dir=str(tmp_path)).script("worker", "parsl.bft", 10)
    assert "#PBS -r n" in pbs.splitlines()


def test_running_pilots_are_released_queued_ones_cancelled(tmp_path):
    squeue = "7|RUNNING|1|2|(null)|n1|None\n8|PENDING|N/A|N/A|||Priority\n"
    prov, calls = _provider(tmp_path, {"squeue": (0, squeue, ""), "sinfo": (0, "n1|alloc\n", "")})
    assert prov.cancel(["7", "8"]) == [True, True]
    assert ["scancel", "--batch", "--signal=USR2", "7"] in calls and ["scancel", "8"] in calls
    assert prov.withdrawn == {"7", "8"}


def _run_pilot(tmp_path, worker, grace_s):
    """The pilot's batch script, run by bash as Slurm would run it (its #SBATCH lines are comments)."""
    prov, _ = _provider(tmp_path, grace_s=grace_s)
    script = tmp_path / "pilot.sh"
    script.write_text(prov.script(worker, "parsl.bft", 10))
    p = subprocess.Popen(["bash", str(script)], env={**os.environ, "SLURM_JOB_ID": "7"}, cwd=tmp_path)
    wait_for(lambda: (tmp_path / "started").exists(), 30, 0.05, what="the worker's start")
    return prov, p


SAVES_IN_4_S = ("bash -c 'trap \"sleep 4; touch saved; exit 0\" TERM; touch started; "
                "while :; do sleep 0.1; done'")


@pytest.mark.timeout(120)
def test_a_terminated_pilot_gives_its_worker_the_grace_to_save(tmp_path):
    """SIGTERM (preemption, scancel): the worker saving for 4 s is not killed at 3 s (as it was) within a
    GraceTime of 8; the pilot marks itself noticed and ends with exit 0 once the worker has."""
    prov, p = _run_pilot(tmp_path, SAVES_IN_4_S, 8)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    wait_for(lambda: p.poll() is not None, 60, 0.05, what="the pilot's end")
    assert (tmp_path / "saved").exists() and p.returncode == 0 and prov.noticed("7")
    assert time.monotonic() - t0 < 8 + 5          # it left when the worker did, not after the whole grace


@pytest.mark.timeout(120)
def test_a_worker_that_does_not_stop_is_killed_after_the_grace(tmp_path):
    ignores = "bash -c 'trap \"\" TERM; touch started; echo $$ > pid; while :; do sleep 0.1; done'"
    _, p = _run_pilot(tmp_path, ignores, 2)
    worker = int(wait_for(lambda: (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else None,
                          30, what="the worker's pid"))
    p.send_signal(signal.SIGTERM)
    wait_for(lambda: p.poll() is not None, 60, 0.05, what="the pilot's end")
    wait_for(lambda: not alive(worker), 10, 0.05, what="the worker's death")


@pytest.mark.timeout(120)
def test_a_released_pilot_stops_its_worker_and_exits_0(tmp_path):
    """USR2 (the pool giving the pilot back): the worker is stopped as on TERM, and the script exits 0 - Slurm
    records COMPLETED - without marking a notice."""
    prov, p = _run_pilot(tmp_path, SAVES_IN_4_S, 8)
    p.send_signal(signal.SIGUSR2)
    wait_for(lambda: p.poll() is not None, 60, 0.05, what="the pilot's end")
    assert p.returncode == 0 and (tmp_path / "saved").exists() and not prov.noticed("7")


# Runs a pilot script as the child of a subreaper that collects nothing until the pilot has ended: an orphan of
# the worker's group stays a zombie meanwhile, as the rank server does under an init slow to reap (PID 1 of a
# container). Writes the pilot's pid to "pilot.pid" and its exit status to "ended".
SUBREAPER = """
import ctypes, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)       # PR_SET_CHILD_SUBREAPER
p = subprocess.Popen(["bash", sys.argv[1]])
open("pilot.pid", "w").write(str(p.pid))
open("ended", "w").write(str(p.wait()))     # waits for the pilot only: the orphan stays a zombie until exit
"""
# The worker's group: a leader and a child it does not collect, both waiting for a signal (TERM ends both at once)
LEAVES_AN_ORPHAN = ("python3 -c 'import os, signal; os.fork() or signal.pause(); open(\"started\", \"w\").close(); "
                    "signal.pause()'")


@pytest.mark.timeout(120)
def test_a_released_pilot_ends_as_its_group_does_though_a_zombie_of_it_is_not_yet_collected(tmp_path):
    """USR2 with a GraceTime of 10 minutes: the worker's group ends on TERM at once but leaves a zombie its
    init has not collected yet. Counted as alive (as `kill -0` on the group did), the pilot would end only
    when the grace does; not counted, it ends as its group did, and the facility job waiting for the node
    starts."""
    prov, _ = _provider(tmp_path, grace_s=600)
    (tmp_path / "pilot.sh").write_text(prov.script(LEAVES_AN_ORPHAN, "parsl.bft", 10))
    reaper = subprocess.Popen([sys.executable, "-c", SUBREAPER, str(tmp_path / "pilot.sh")], cwd=tmp_path,
                              env={**os.environ, "SLURM_JOB_ID": "7"})
    try:
        wait_for(lambda: (tmp_path / "started").exists() and (tmp_path / "pilot.pid").exists(), 30, 0.05,
                 what="the worker's start")
        os.kill(int((tmp_path / "pilot.pid").read_text()), signal.SIGUSR2)
        # far within the grace: 30 s is a loaded machine's reaction, not the 600 s grace's end
        status = wait_for(lambda: (tmp_path / "ended").exists() and (tmp_path / "ended").read_text(), 30, 0.05,
                          what="the released pilot's end while a zombie of its group waits to be collected")
        assert status == "0"
    finally:
        reaper.kill()
        reaper.wait()
