"""Pilots and the facility's plan, on recorded Slurm output: no pilot goes into a hole shorter than the shortest
pilot, and a pilot a facility job is planned behind (it arrived after the pilot started) is given back."""

from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider

NOW = 1_795_000_000


def provider(squeue: str, tmp_path, sinfo: str = "n7|alloc\nn8|idle\n") -> SlurmPilotProvider:
    def run(argv):
        if argv[0] == "sinfo":
            return 0, sinfo, ""
        if argv[:2] == ["squeue", "-h"]:
            return 0, squeue, ""
        return 0, "", ""
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), script_dir=str(tmp_path), poll_s=1)
    prov.clock = lambda: NOW
    return prov


def test_a_facility_job_planned_behind_a_running_pilot_claims_its_node(tmp_path):
    # squeue -h -t all -o %i|%T|%S|%e|%Y|%N|%r (SLURM_TIME_FORMAT=%s): our pilot 11 runs on n7 for 10 more
    # minutes; job 12 arrived since and waits for n7 and n8 until the pilot's walltime ends (no preemption)
    queue = (f"11|RUNNING|{NOW - 60}|{NOW + 600}|(null)|n7|None\n"
             f"12|PENDING|{NOW + 600}|N/A|n[7-8]||Resources\n")
    prov = provider(queue, tmp_path)
    prov.submitted["11"] = NOW - 70
    assert prov.claimed(8) == {"n7"}
    # a job planned on n7 well after the pilot ends is not waiting for it: the pilot keeps its hole
    later = provider(f"11|RUNNING|{NOW - 60}|{NOW + 600}|(null)|n7|None\n"
                     f"12|PENDING|{NOW + 900}|N/A|n[7-8]||Resources\n", tmp_path)
    later.submitted["11"] = NOW - 70
    assert later.claimed(8) == set()
    # a job planned onto a pilot's node within the lead time claims it, as before
    soon = provider(f"11|RUNNING|{NOW - 60}|{NOW + 600}|(null)|n7|None\n"
                    f"12|PENDING|{NOW + 5}|N/A|n[7-8]||Resources\n", tmp_path)
    soon.submitted["11"] = NOW - 70
    assert soon.claimed(8) == {"n7", "n8"}


def test_no_pilot_for_a_hole_shorter_than_the_shortest_pilot(tmp_path):
    # n8 is idle until job 12's planned start: 50 s from now, 2 minutes from now
    short = provider(f"12|PENDING|{NOW + 50}|N/A|n[7-8]||Resources\n", tmp_path)
    assert short.current_holes() == []
    long = provider(f"12|PENDING|{NOW + 120}|N/A|n[7-8]||Resources\n", tmp_path)
    assert [h.node for h in long.current_holes()] == ["n8"] and long.walltime_minutes(now=NOW) == 2
