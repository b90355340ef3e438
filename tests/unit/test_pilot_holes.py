"""Pilots and the facility's plan, on recorded Slurm output: no pilot goes into a hole shorter than the shortest
pilot, and a pilot a facility job is planned behind (it arrived after the pilot started) is given back."""

from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider

NOW = 1_795_000_000


def provider(squeue: str, tmp_path, sinfo: str = "n7|alloc\nn8|idle\n", resv: str = "") -> SlurmPilotProvider:
    def run(argv):
        if argv[0] == "sinfo":
            return 0, sinfo, ""
        if argv[:2] == ["squeue", "-h"]:
            return 0, squeue, ""
        if argv[:3] == ["scontrol", "show", "reservation"]:
            return 0, resv, ""
        return 0, "", ""
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), script_dir=str(tmp_path), poll_s=1)
    prov.clock = lambda: NOW
    return prov


def changing(said: dict[str, str], tmp_path, asked: list[str] | None = None) -> tuple[SlurmPilotProvider, list[int]]:
    """A provider whose commands answer from ``said`` (by command name; the test changes it between surveys),
    and its clock (``now[0]``, which the test moves on); each command's name goes to ``asked``."""
    def run(argv):
        if asked is not None:
            asked.append(argv[0])
        return 0, said.get(argv[0], ""), ""
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(run), script_dir=str(tmp_path), poll_s=1)
    now = [NOW]
    prov.clock = lambda: now[0]
    return prov, now


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


def test_no_pilot_where_the_job_planned_behind_one_that_ended_early_starts(tmp_path):
    # a 2-node job ended early on n7 and n8; job 13, planned there at that job's time limit, has not started yet:
    # the scheduler starts it at its next pass (pilots sent there only queued behind it; 6 did, in a replay)
    nxt = provider(f"13|PENDING|{NOW + 600}|N/A|n[7-8]||Resources\n", tmp_path, sinfo="n7|idle\nn8|idle\n")
    assert nxt.current_holes() == []
    # the same job held back by something besides nodes (a limit of its user's) leaves a hole until its start
    held = provider(f"13|PENDING|{NOW + 600}|N/A|n[7-8]||QOSMaxJobsPerUserLimit\n", tmp_path,
                    sinfo="n7|idle\nn8|idle\n")
    assert sorted(h.node for h in held.current_holes()) == ["n7", "n8"]
    # the nodes and the queue are two queries: job 13 started between them, on nodes sinfo still called idle
    started = provider(f"13|RUNNING|{NOW}|{NOW + 600}|(null)|n[7-8]|None\n", tmp_path, sinfo="n7|idle\nn8|idle\n")
    assert started.current_holes() == []
    # and one planned onto a busy node as well waits: the idle one is a hole until then
    part = provider(f"13|PENDING|{NOW + 600}|N/A|n[6-7]||Resources\n", tmp_path, sinfo="n6|alloc\nn7|idle\n")
    assert [(h.node, h.until) for h in part.current_holes()] == [("n7", NOW + 600)]
    # a job planned onto an idle node behind another planned there first does not start now: the node is a hole
    # until the first one's start (replay r14: n4 idle for 143 s, and no pilot, as job 21 was planned there)
    behind = provider(f"15|PENDING|{NOW + 1400}|N/A|n[3-4]||Resources\n21|PENDING|{NOW + 4300}|N/A|n4||Priority\n",
                      tmp_path, sinfo="n3|alloc\nn4|idle\n")
    assert [(h.node, h.until) for h in behind.current_holes()] == [("n4", NOW + 1400)]


def test_nodes_just_freed_are_no_hole_while_a_waiting_job_fits_in_the_idle_ones(tmp_path):
    # replay r15: a job ended; job 15, planned 23 minutes ahead onto other nodes (a plan made before these were
    # freed), started on them at the scheduler's next pass, and 4 pilots sent there only queued behind it
    busy = "n1|alloc\nn2|alloc\nn3|alloc\n"
    said = {"sinfo": busy, "squeue": f"15|PENDING|{NOW + 1400}|N/A|n[1,4]||Resources|2|20:00\n"}
    prov, now = changing(said, tmp_path)
    assert prov.current_holes() == []
    said["sinfo"] = "n1|alloc\nn2|idle\nn3|idle\n"
    now[0] += 1
    assert prov.current_holes() == []
    # a survey later the job has not started there: the nodes are holes until its planned start
    now[0] += 1
    assert [(h.node, h.until) for h in prov.current_holes()] == [("n2", NOW + 1400), ("n3", NOW + 1400)]
    # freed nodes too few for any waiting job are holes at once
    said["sinfo"], said["squeue"] = busy, f"15|PENDING|{NOW + 1400}|N/A|n[1-3]||Resources|3|20:00\n"
    now[0] += 1
    assert prov.current_holes() == []
    said["sinfo"] = "n1|alloc\nn2|idle\nn3|idle\n"
    now[0] += 1
    assert [h.node for h in prov.current_holes()] == ["n2", "n3"]


def test_nodes_of_a_reservation_under_way_are_no_holes_until_it_ends(tmp_path):
    # a maintenance reservation holds n1-n3, which sinfo shows idle (checked on the local Slurm), and job 15
    # waits for it; pilots sent there would queue, be withdrawn and be sent again until it ended
    maint = f"ReservationName=maint StartTime={NOW - 600} EndTime={NOW + 3600} Nodes=n[1-3] NodeCnt=3 Flags=MAINT\n"
    said = {"sinfo": "n1|idle\nn2|idle\nn3|idle\n", "scontrol": maint,
            "squeue": f"15|PENDING|{NOW + 3600}|N/A|n1||ReqNodeNotAvail, Reserved for maintenance|1|20:00\n"}
    asked: list[str] = []
    prov, now = changing(said, tmp_path, asked)
    assert prov.current_holes() == []
    # deleted early: the next survey reads the reservations again (not a minute later); the job no pass has
    # judged yet (reason None) would fit in the nodes just freed, so they are no holes for that survey ...
    said["scontrol"] = "No reservations in the system\n"
    said["squeue"] = "15|PENDING|N/A|N/A|||None|1|20:00\n"
    now[0] += 1
    assert prov.current_holes() == []
    assert asked.count("scontrol") == 2
    # ... and the one it did not take is a hole at the next
    said["sinfo"] = "n1|alloc\nn2|idle\nn3|idle\n"
    said["squeue"] = f"15|RUNNING|{NOW + 1}|{NOW + 1201}|(null)|n1|None|1|20:00\n"
    now[0] += 1
    assert [h.node for h in prov.current_holes()] == ["n2", "n3"]
    assert asked.count("scontrol") == 2          # none under way: once a minute again


def test_the_sites_own_reservation_is_where_its_pilots_go(tmp_path):
    mine = f"ReservationName=bft StartTime={NOW - 600} EndTime={NOW + 3600} Nodes=n[7-8] NodeCnt=2\n"
    prov = provider("", tmp_path, sinfo="n7|idle\nn8|idle\n", resv=mine)
    prov.reservation = "bft"
    assert [h.node for h in prov.current_holes()] == ["n7", "n8"]
    prov = provider("", tmp_path, sinfo="n7|idle\nn8|idle\n", resv=mine)
    assert prov.current_holes() == []


def test_a_job_slurm_preempts_a_pilot_for_takes_no_second_one(tmp_path):
    # replay r22 (preemptable partition): job 18 arrived and is planned onto n5, our pilot 14's node, while Slurm
    # preempts our pilot 11 on n8 for it (a preempted job stays RUNNING, its end moved to now + GraceTime);
    # giving n5 back as well cost a second pilot
    pilots = (f"11|RUNNING|{NOW - 135}|{NOW + 9}|(null)|n8|None|1|5:00\n"
              f"14|RUNNING|{NOW - 87}|{NOW + 33}|(null)|n5|None|1|2:00\n")
    waits = f"18|PENDING|{NOW}|N/A|n5||Resources|1|2:00\n"

    def claimed(queue: str) -> set[str]:
        prov = provider(queue, tmp_path, sinfo="n5|alloc\nn8|alloc\n")
        prov.submitted.update({"11": NOW - 140, "14": NOW - 90})
        return prov.claimed(4)
    assert claimed(pilots + waits) == set()
    # no preemption under way (pilot 11's end is its start + limit): the node the job is planned onto goes back
    assert claimed(pilots.replace(f"{NOW + 9}", f"{NOW + 165}") + waits) == {"n5"}
    # the preempted pilot is the one it is planned onto: it goes back at once, without waiting for the grace
    assert claimed(pilots + waits.replace("|n5|", "|n8|")) == {"n8"}
    # a 2-node job: one node being preempted is not enough, both it is planned onto go back
    assert claimed(pilots + waits.replace("|n5||Resources|1|", "|n[5,8]||Resources|2|")) == {"n5", "n8"}


def test_a_job_that_would_start_now_but_for_a_pilot_gets_the_youngest_pilots_once(tmp_path):
    # no preemption: pilots 11 (n5, since 100 s) and 14 (n7, since 10 s) hold their nodes for 30 minutes; job 13
    # arrived and waits for n6, where facility job 12 ends in 60 s, though alone it would have started on a
    # pilot's node at once: the youngest pilot gives it n7
    run = (f"11|RUNNING|{NOW - 100}|{NOW + 1800}|(null)|n5|None\n"
           f"14|RUNNING|{NOW - 10}|{NOW + 1800}|(null)|n7|None\n"
           f"12|RUNNING|{NOW - 500}|{NOW + 60}|(null)|n6|None\n")
    prov = provider(run + f"13|PENDING|{NOW + 60}|N/A|n6||Resources\n", tmp_path, sinfo="n5|alloc\nn6|alloc\n")
    prov.submitted.update({"11": NOW - 110, "14": NOW - 20})
    assert prov.claimed(4) == {"n7"}
    # still waiting at the next survey: the same pilot, not another one too
    prov._snapshot = None
    assert prov.claimed(4) == {"n7"}
    # once that pilot has gone, a new pilot on n7 is not taken for the same job again
    again = run.replace("14|RUNNING", "15|RUNNING") + f"13|PENDING|{NOW + 60}|N/A|n6||Resources\n"
    prov.cmd = SlurmCommands(lambda argv: (0, again, "") if argv[:2] == ["squeue", "-h"] else
                             (0, "n5|alloc\nn6|alloc\n", "") if argv[0] == "sinfo" else (0, "", ""))
    prov._snapshot = None
    prov.submitted["15"] = NOW - 5
    assert prov.claimed(4) == set()
    # once the job has left the queue its record goes too: a long run's books do not grow with every job
    prov.cmd = SlurmCommands(lambda argv: (0, run, "") if argv[:2] == ["squeue", "-h"] else (0, "", ""))
    prov._snapshot = None
    assert prov.claimed(4) == set() and prov._yielded == {}


def test_a_job_the_idle_nodes_start_or_the_pilots_cannot_start_takes_no_pilot(tmp_path):
    run = (f"11|RUNNING|{NOW - 100}|{NOW + 1800}|(null)|n5|None\n"
           f"12|RUNNING|{NOW - 500}|{NOW + 60}|(null)|n6|None\n")
    # a 2-node job planned at n6's end: the one pilot and no idle node cannot start it now
    prov = provider(run + f"13|PENDING|{NOW + 60}|N/A|n[6-7]||Resources\n", tmp_path, sinfo="n5|alloc\nn6|alloc\n")
    prov.submitted["11"] = NOW - 110
    assert prov.claimed(4) == set()
    # a job an idle node (n8) starts without the pilot's
    idle = provider(run + f"13|PENDING|{NOW + 60}|N/A|n6||Resources\n", tmp_path, sinfo="n5|alloc\nn8|idle\n")
    idle.submitted["11"] = NOW - 110
    assert idle.claimed(4) == set()


def test_a_job_a_pilot_keeps_from_starting_now_gets_it_though_planned_after_the_pilot_ends(tmp_path):
    """Seen at 5x (facility replay r7): a 1-node job queued behind larger ones became the first in line while
    our pilot held the one node alone it would have started on. Its plan lay beyond the pilot's walltime, so
    no rule caught it, and it waited 17 s for the pilot's end. Its time limit says it would start now."""
    # pilot 11 on n4 for 20 more s; job 12 (3 nodes) planned at +1000 s on n1-n3; job 13 (1 node, 5 minutes)
    # planned at +3000 s on n1, behind job 12; no idle node
    run = f"11|RUNNING|{NOW - 40}|{NOW + 20}|(null)|n4|None|1|1:00\n"
    big = f"12|PENDING|{NOW + 1000}|N/A|n[1-3]||Resources|3|30:00\n"
    small = f"13|PENDING|{NOW + 3000}|N/A|n1||Priority|1|5:00\n"
    prov = provider(run + big + small, tmp_path, sinfo="n1|alloc\nn4|alloc\n")
    prov.submitted["11"] = NOW - 50
    assert prov.claimed(4) == {"n4"}
    # a job planned before it takes n4 within its 5 minutes: backfill would not start it there; the pilot stays
    first = f"12|PENDING|{NOW + 100}|N/A|n[2-4]||Resources|3|30:00\n"
    prov = provider(run + first + small, tmp_path, sinfo="n1|alloc\nn4|alloc\n")
    prov.submitted["11"] = NOW - 50
    assert prov.claimed(4) == set()
    # ... but it fits before that job if its limit is 1 minute: it gets the pilot
    short = small.replace("|5:00", "|1:00")
    prov = provider(run + first + short, tmp_path, sinfo="n1|alloc\nn4|alloc\n")
    prov.submitted["11"] = NOW - 50
    assert prov.claimed(4) == {"n4"}
    # a reservation on n4 that begins within its limit keeps the pilot, as a planned job does
    maint = f"ReservationName=maint StartTime={NOW + 120} EndTime={NOW + 720} Nodes=n4 NodeCnt=1\n"
    prov = provider(run + big + small, tmp_path, sinfo="n1|alloc\nn4|alloc\n", resv=maint)
    prov.submitted["11"] = NOW - 50
    assert prov.claimed(4) == set()


def test_a_finished_pilot_the_queue_still_lists_holds_no_node(tmp_path):
    """Seen in the held-back replay (r27): squeue lists finished pilots for minutes. Pilot 20 (n4) had ended and
    pilot 22 ran on n4 since; counted as holding a node, 20 made the running pilots 22 and 18 look enough for a
    3-node job, which could not start without a facility job's node. Both were given back, and every new pilot
    on n4 or n8 was given back to that job within seconds of its start, for the rest of the run."""
    facility = (f"9|RUNNING|{NOW - 300}|{NOW + 5400}|(null)|n[1-3]|None|3|95:00\n"
                f"10|RUNNING|{NOW - 300}|{NOW + 5100}|(null)|n[5-6]|None|2|90:00\n"
                f"23|RUNNING|{NOW - 150}|{NOW + 4170}|(null)|n7|None|1|72:00\n")
    pilots = (f"20|COMPLETED|{NOW - 257}|{NOW - 203}|(null)|n4|None|1|30:00\n"
              f"22|RUNNING|{NOW - 203}|{NOW + 1597}|(null)|n4|None|1|30:00\n"
              f"18|RUNNING|{NOW - 257}|{NOW + 1543}|(null)|n8|None|1|30:00\n")
    big = f"24|PENDING|{NOW + 5400}|N/A|n[1-3]||Resources|3|58:00\n"
    said = {"squeue": facility + pilots + big, "sinfo": "".join(f"n{i}|alloc\n" for i in range(1, 9))}
    prov, now = changing(said, tmp_path)
    prov.submitted.update({"20": NOW - 260, "22": NOW - 205, "18": NOW - 260})
    assert prov.claimed(4) == set()
    # a 2-node job the two running pilots do start gets them; once they have ended (still listed), the new
    # pilot on n4 is not given back to it
    two = big.replace("|3|", "|2|").replace("n[1-3]", "n[1-2]")
    said["squeue"] = facility + pilots + two
    now[0] += 1
    assert prov.claimed(4) == {"n4", "n8"}
    said["squeue"] = (facility + pilots.replace("RUNNING", "COMPLETED") + two
                      + f"27|RUNNING|{NOW + 5}|{NOW + 65}|(null)|n4|None|1|1:00\n")
    prov.submitted["27"] = NOW + 3
    now[0] += 5
    assert prov.claimed(4) == set()
