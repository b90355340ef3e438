"""The Slurm back end on canned command output (tests/data/slurm; no Slurm runs here): the parsers, and the pilot
provider's holes, scripts, refusals, pilot states, reservations and topology. On a real local Slurm:
tests/e2e/test_slurm.py."""
import math
import time
from datetime import datetime

import pytest
from fakes import Canned, recorded
from parsl.jobs.states import JobState

from parsl_bft.execution.commands import SchedulerError
from parsl_bft.execution.pilot import PilotsRefused
from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider
from parsl_bft.execution.slurm.commands import (
    parse_job_limit,
    parse_reservations,
    parse_sacct,
    parse_sbatch,
    parse_sinfo_nodes,
    parse_squeue,
    parse_test_only,
)

# recorded on the local 8-node cluster (tools/local-slurm.sh): a 6-node job running, an 8-node job waiting
SINFO = recorded("slurm/sinfo.txt")
SQUEUE = recorded("slurm/squeue.txt")
TEST_ONLY = recorded("slurm/sbatch_test_only.txt")
RESV = recorded("slurm/scontrol_show_reservation.txt")
SACCT = recorded("slurm/sacct.txt")
TOPOLOGY = recorded("topology/scontrol_show_topology_3sw.txt")


def test_parsers_on_recorded_output():
    nodes = parse_sinfo_nodes(SINFO)
    assert [n.name for n in nodes if n.usable] == ["n7", "n8"]
    assert not parse_sinfo_nodes("n1|idle*\n")[0].usable          # not responding
    done, pend, run = parse_squeue(SQUEUE)
    assert pend.job_id == "2" and pend.state == "PENDING" and pend.end is None
    assert pend.start == datetime.fromisoformat("2026-11-21T18:19:55").timestamp()
    assert pend.nodes == tuple(f"n{i}" for i in range(1, 9))           # where backfill plans to start it
    assert run.nodes == tuple(f"n{i}" for i in range(1, 7)) and run.end == pend.start
    assert done.state == "COMPLETED" and done.nodes == ("n7",)
    assert parse_squeue("5|PENDING|N/A|N/A|||Priority\n")[0].start is None
    assert parse_squeue("5|PENDING|1795417921|N/A|||Priority\n")[0].start == 1795417921   # SLURM_TIME_FORMAT=%s
    # %D and %l: nodes asked for, time limit (days-h:m:s, h:m:s, m:s, minutes; UNLIMITED); absent in older output
    asked = parse_squeue("5|PENDING|N/A|N/A|||Priority|3|1-02:00:30\n6|PENDING|N/A|N/A|||Priority|1|UNLIMITED\n"
                         "7|PENDING|N/A|N/A|||Priority|1|5:00\n8|PENDING|N/A|N/A|||Priority|2|10\n")
    assert [(j.size, j.limit_s) for j in asked] == [(3, 26 * 3600 + 30), (1, None), (1, 300), (2, 600)]
    assert (pend.size, pend.limit_s) == (0, None)
    assert parse_job_limit("|\n") is None and parse_job_limit("20|\n|8\n") == 8      # sacctmgr assoc caps
    assert parse_sbatch("Submitted batch job 42\n") == "42"
    with pytest.raises(ValueError, match="no job id"):
        parse_sbatch("sbatch: error: invalid partition\n")
    start, where = parse_test_only(TEST_ONLY)
    assert where == "n7" and start == datetime.fromisoformat("2026-11-21T18:18:57").timestamp()
    assert [(r.job_id, r.state) for r in parse_sacct(SACCT)] == [("7", "TIMEOUT"), ("8", "CANCELLED")]
    (r,) = parse_reservations(RESV)
    assert r.nodes == ("n1", "n2") and r.start == datetime.fromisoformat("2026-11-21T20:37:48").timestamp()
    assert parse_reservations("No reservations in the system\n") == []


def test_holes_and_pilot_scripts_on_canned_slurm(tmp_path):
    start = datetime.fromisoformat("2026-11-21T18:19:55").timestamp()
    run = Canned({"sinfo": (0, SINFO, ""), "squeue -h -t all": (0, SQUEUE, ""),
                  "sbatch": (0, "Submitted batch job 11\n", "")})
    cmd = SlurmCommands(run)
    prov = SlurmPilotProvider("debug", qos="standby", commands=cmd, script_dir=str(tmp_path), notice_s=45)
    prov.clock = lambda: start - 10 * 60 - 5           # the recorded queue, 10 minutes before its planned start
    holes = prov.current_holes()
    assert [h.node for h in holes] == ["n7", "n8"] and all(h.until == start for h in holes)
    assert prov.walltime_minutes() == 10                               # the hole: 10 whole minutes
    assert prov.claimed(60, now=start - 30) == {f"n{i}" for i in range(1, 9)}   # the head job wants them soon
    assert prov.claimed(60, now=start - 300) == set()
    jid = prov.submit("process_worker_pool.py --foo", 1, "pilot")
    assert jid == "11"
    before = dict(cmd.per_minute())
    for i in range(4):                         # one scale-out of 4 pilots: one survey, one walltime check
        prov.submit("process_worker_pool.py --foo", 1, f"more{i}")
    after = cmd.per_minute()
    assert after.get("sinfo", 0) - before.get("sinfo", 0) <= 1 and after.get("squeue", 0) - before.get("squeue", 0) <= 1
    assert sum(c[:2] == ["sbatch", "--test-only"] for c in run.calls) <= 2 and after["sbatch"] >= 5
    script = next(tmp_path.glob("pilot.*.sh")).read_text()
    for opt in ("--nodes=1", "--time=10", "--signal=B:USR1@45", "--qos=standby", "--partition=debug"):
        assert f"#SBATCH {opt}" in script
    assert "process_worker_pool.py --foo" in script and "trap" in script
    prov.clock = lambda: start - 50                    # 50 s before the planned start: shorter than any pilot
    prov.snapshot(max_age_s=0)
    assert prov.current_holes() == []                  # so no pilot goes there (it would delay that job)


def test_the_same_refusal_three_times_stops_submitting(tmp_path):
    """A pilot the scheduler refuses is not retried forever: the same words three times in a row make the
    provider refused, and no further sbatch is run; a refusal with other words, or a success, starts a new row."""
    calls, answers = [], iter([(1, "", "sbatch: error: Invalid account"), (0, "Submitted batch job 41\n", ""),
                               *[(1, "", "sbatch: error: Invalid account or account/partition combination")] * 9])

    def run(argv):
        if argv[0] != "sbatch" or argv[1] == "--test-only":       # surveys and probes: nothing to say
            return 0, "", ""
        calls.append(argv)
        return next(answers)
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), script_dir=str(tmp_path))
    with pytest.raises(SchedulerError):
        prov.submit("worker", 1)
    assert prov.submit("worker", 1) == "41"                     # a success ends the row
    for _ in range(3):
        with pytest.raises(SchedulerError):
            prov.submit("worker", 1)
    assert "refused 3 pilots in a row: sbatch: error: Invalid account or account/partition" in str(prov.refused)
    with pytest.raises(PilotsRefused):
        prov.submit("worker", 1)
    assert len(calls) == 5                                      # nothing submitted once refused


def test_pilot_states_never_failed_for_reclaims(tmp_path):
    run = Canned({"squeue -h -t all": (0, "11|RUNNING|1|2|(null)|n7|None\n12|PENDING|N/A|N/A|||Resources\n", ""),
                  "sacct -X": (0, "Slurm accounting storage is disabled\n", ""),   # no slurmdbd ...
                  "sacct -c -X": (0, SACCT, "")})                                  # ... the completion log
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), script_dir=str(tmp_path), max_pending_s=60)
    prov.submitted.update({"11": time.time(), "12": time.time(), "7": time.time(), "8": time.time()})
    st = {j: s.state for j, s in zip(["11", "12", "7", "8", "99"], prov.status(["11", "12", "7", "8", "99"]))}
    assert st == {"11": JobState.RUNNING, "12": JobState.PENDING, "7": JobState.TIMEOUT, "8": JobState.SCALED_IN,
                  "99": JobState.MISSING}
    prov.submitted["12"] = time.time() - 120                            # pending too long: withdrawn
    st = prov.status(["12"])[0]
    assert st.state == JobState.SCALED_IN and "withdrawn" in st.message
    assert any(c[0] == "scancel" and "12" in c for c in run.calls)


def test_a_pilot_being_signalled_still_runs(tmp_path, caplog):
    """squeue shows a set flag instead of the base state: a pilot being sent its --signal notice is SIGNALING.
    It still holds its node: taking it for gone killed its ranks and left it running, unused, holding a node a
    facility job then waited for. A state this provider does not know counts as running where it holds nodes."""
    queue = recorded("slurm/squeue_flags.txt")
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(Canned({"squeue -h -t all": (0, queue, "")})),
                              script_dir=str(tmp_path))
    prov.submitted.update({j: time.time() for j in ["11", "12", "13", "14", "15", "16"]})
    assert set(prov.where(["11", "12", "13", "14", "15", "16"])) == {"11", "13", "14"}
    assert "'FROBNICATING', unknown to SlurmPilotProvider: taken as running on n5" in caplog.text
    assert [s.state for s in prov.status(["11", "12", "16"])] == [JobState.RUNNING, JobState.HELD, JobState.FAILED]


def test_bad_provider_config():
    with pytest.raises(ValueError, match="walltime bounds"):
        SlurmPilotProvider(walltime_min_min=5, walltime_max_min=2)


def test_reservations_end_holes_and_test_only_confirms_pilot_walltime(tmp_path):
    soon = datetime.fromtimestamp(time.time() + 600).strftime("%Y-%m-%dT%H:%M:%S")
    later = datetime.fromtimestamp(time.time() + 3600).strftime("%Y-%m-%dT%H:%M:%S")
    resv = RESV.replace("2026-11-21T20:37:48", soon).replace("Nodes=n[1-2]", "Nodes=n7")
    answers = {"sinfo": (0, SINFO, ""), "squeue -h -t all": (0, "", ""),
               "scontrol show reservation": (0, resv, ""),
               "sbatch --test-only": (0, "", f"sbatch: Job 3 to start at {later} using 4 processors on nodes n7 "
                                             "in partition debug\n")}
    cmd = SlurmCommands(Canned(answers))
    prov = SlurmPilotProvider("debug", commands=cmd, script_dir=str(tmp_path), walltime_min_min=2,
                              walltime_max_min=30)
    holes = {h.node: h.until for h in prov.current_holes()}
    assert holes["n8"] == math.inf and holes["n7"] == datetime.fromisoformat(soon).timestamp()
    assert prov.walltime_minutes() == 2          # --test-only says a 9-minute pilot would wait an hour: shortest
    answers["sbatch --test-only"] = (0, "", "")
    assert prov.walltime_minutes() == 2          # asked once per survey ...
    prov.snapshot(max_age_s=0)
    assert prov.walltime_minutes() == 9          # ... and again at the next


def test_a_failing_squeue_is_an_error_not_an_empty_cluster(tmp_path):
    from parsl_bft.execution.slurm.commands import SlurmError
    busy = SlurmCommands(lambda argv: (1, "", "slurm_load_jobs error: Socket timed out on send/recv operation\n"))
    prov = SlurmPilotProvider("debug", commands=busy, script_dir=str(tmp_path))
    prov.submitted["7"] = 0.0
    with pytest.raises(SlurmError, match="Socket timed out"):
        prov.status(["7"])                       # not "pilot 7 is missing"


@pytest.mark.parametrize("rc, ok", [(0, True), (1, True), (229, True), (225, True), (2, False)])
def test_releasing_a_pilot_that_already_ends_is_no_error(rc, ok):
    """A pilot given back twice while it ended (the pool's snapshot still showed it running): scancel exits with
    Slurm's error number mod 256, 229 (ESLURM_ALREADY_DONE); that raised and stopped the run."""
    from parsl_bft.execution.slurm.commands import SlurmError
    cmd = SlurmCommands(lambda argv: (rc, "", ""))
    for call in (cmd.release, cmd.cancel):
        if ok:
            call(["5", "6"])
        else:
            with pytest.raises(SlurmError, match="exit 2"):
                call(["5", "6"])


def test_the_topology_is_asked_of_slurm_once(tmp_path, caplog):
    answers = {"scontrol show topology": (0, TOPOLOGY, "")}
    runner = Canned(answers)
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(runner), script_dir=str(tmp_path))
    topo = prov.topology()
    assert topo.by_group(["n1", "n4", "n8"]) == {"s0": ["n1"], "s1": ["n4"], "s2": ["n8"]}
    assert prov.topology() is topo and len(runner.calls) == 1
    answers["scontrol show topology"] = (0, "", "No topology information available\n")     # topology/none
    assert SlurmPilotProvider("debug", commands=SlurmCommands(runner), script_dir=str(tmp_path)).topology() is None
    answers["scontrol show topology"] = (1, "", "slurm_load_topo error: Socket timed out\n")
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(runner), script_dir=str(tmp_path))
    assert prov.topology() is None and prov.topology() is None and len(runner.calls) == 3
    assert "Socket timed out" in caplog.text


def test_a_pool_polling_every_poll_s_gets_a_fresh_survey_every_poll():
    """The pool reads its clock a little before the provider's survey starts; the next poll, poll_s later by
    the pool's clock, finds that survey a little short of poll_s old. It must still be surveyed anew, or a
    facility job that arrived is seen a whole poll late (and waits that much longer for a pilot's node)."""
    surveys, clock = [], {"t": 1_800_000_000.0}

    def run(argv):
        if argv[0] == "squeue":
            surveys.append(clock["t"])
        return 0, "", ""
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), poll_s=1)
    prov.clock = lambda: clock["t"]
    for poll in range(5):
        clock["t"] = 1_800_000_000.0 + poll + (0.1 if poll % 2 == 0 else 0.0)   # the survey's clock read jitters
        prov.snapshot()
    assert len(surveys) == 5, f"{len(surveys)} surveys in 5 polls: {surveys}"
