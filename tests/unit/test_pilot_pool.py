"""PilotPool, the pilots' state machine (queued, running, noticed, left, gone), driven on a test clock: against
FakePilots (no scheduler, no Parsl) and against a real SlurmPilotProvider on a CannedCluster (tests/fakes.py).
On a real HTEX: tests/e2e/test_pilot_pool_htex.py; on a real Slurm: tests/e2e/test_slurm.py."""
import math

import pytest
from fakes import CannedCluster, CannedExecutor, FakePilots, no_hold

from parsl_bft.execution.pool import PilotPool, PilotState
from parsl_bft.execution.slurm import SlurmCommands, SlurmPilotProvider
from parsl_bft.topology import Topology


def _fake_pool(**kw):
    """A started PilotPool on FakePilots and a test clock (advance ``clock["t"]``): (clock, fake, pool)."""
    clock, fake = {"t": 1000.0}, FakePilots()
    pool = PilotPool(fake, clock=lambda: clock["t"], hold=fake.hold, **kw)
    pool.start()
    return clock, fake, pool


def _one_pilot_joined(clock, fake, pool, walltime_s: float) -> None:
    """One hole, one pilot on n7 whose walltime ends ``walltime_s`` after it starts: it joins."""
    fake.holes_n = 1
    clock["t"] += 1
    pool.poll()
    fake.running["100"], fake.managers = ("n7", clock["t"] + walltime_s), {"0"}
    clock["t"] += 1
    assert [e.kind for e in pool.poll()] == ["join"]


def test_a_pilot_whose_end_the_scheduler_moves_forward_is_noticed_as_preempted():
    """Slurm preempting a job keeps it RUNNING and moves its end to now + GraceTime: that is a preemption, not
    its walltime (a replay's event log called it "walltime ends")."""
    clock, fake, pool = _fake_pool(max_nodes=1, probe_s=100.0, poll_s=0.0)
    _one_pilot_joined(clock, fake, pool, walltime_s=1800)
    clock["t"] += 5
    fake.running["100"] = ("n7", clock["t"] + 10)
    assert [(e.kind, e.why) for e in pool.poll()] == [("notice", "preempted")]


def test_a_pilot_whose_worker_pool_is_lost_is_cancelled_not_left_holding_its_node():
    clock, fake, pool = _fake_pool(max_nodes=1, probe_s=60.0, poll_s=0.0, release_s=3.0)
    fake.holes_n = 1
    pool.poll()
    fake.running["100"], fake.managers = ("n7", math.inf), {"0"}
    clock["t"] += 1
    assert [e.kind for e in pool.poll()] == ["join"]
    fake.managers.clear()                               # its worker pool died; the scheduler still runs the job
    fake.busy_cancel = True                             # ... and scancel fails once: tried again
    clock["t"] += 1
    assert [(e.kind, e.nodes) for e in pool.poll()] == [("leave", ("n7",))] and fake.cancelled == []
    assert pool.states()["100"] == PilotState.LEFT          # to cancel while the scheduler still runs it
    clock["t"] += 1
    pool.poll()
    assert fake.cancelled == ["100"] and "100" not in fake.running and pool.states()["100"] == "gone"
    # claims are read from every poll's survey, not only at the (here 60 s) probe for new pilots
    fake.running["101"], fake.managers = ("n8", math.inf), {"1"}
    fake.blocks_to_job_id["1"] = "101"
    clock["t"] += 1
    assert [e.kind for e in pool.poll()] == ["join"]
    fake.claims = {"n8"}
    clock["t"] += 1
    assert [(e.kind, e.why) for e in pool.poll()] == [("notice", "a facility job is planned onto it")]
    clock["t"] += 3
    assert [e.kind for e in pool.poll()] == ["leave"] and fake.cancelled == ["100", "101"]


def test_pilot_pool_joins_notices_claims_and_replaces_pilots():
    clock, fake, pool = _fake_pool(max_nodes=2, probe_s=1.0, poll_s=0.0, release_s=3.0)

    def step(dt=1.0):
        clock["t"] += dt
        return [(e.kind, e.nodes) for e in pool.poll()]
    fake.holes_n = 3
    assert step() == [] and list(fake.blocks_to_job_id.values()) == ["100", "101"]   # max_nodes pilots
    fake.running["100"] = ("n7", clock["t"] + 120)
    assert step() == []                                 # running, but its worker pool has not connected
    fake.managers.add("0")
    assert step() == [("join", ("n7",))]
    fake.running["101"] = ("n8", clock["t"] + 30)       # its walltime ends within notice_s (20 s) in 10 s
    fake.managers.add("1")
    assert step() == [("join", ("n8",))]
    assert step(10) == [("notice", ("n8",))] and fake.held == ["1"]
    # a noticed pilot does not count: a replacement goes to a free hole at once
    assert pool.states() == {"100": PilotState.RUNNING, "101": PilotState.NOTICED, "102": PilotState.QUEUED}
    assert len(fake.blocks_to_job_id) == 3
    fake.busy = True                                    # the scheduler does not answer: nothing left
    assert step() == []
    fake.busy = False
    # a waiting facility job is planned onto n7: notice now, cancel release_s later, then it leaves
    fake.claims = {"n7"}
    assert step() == [("notice", ("n7",))]
    assert step() == [] and fake.cancelled == []
    assert step(3) == [("leave", ("n7",))] and fake.cancelled == ["100"]
    fake.marks.add("102")                               # the scheduler's own signal marks a pilot
    fake.running["102"] = ("n1", None)
    fake.managers.add("2")
    assert step() == [("join", ("n1",))]
    assert step() == [("notice", ("n1",))] and "2" in fake.held
    # a pilot starting on a node a facility job is planned onto, before its worker pool joined: it holds
    # nothing to checkpoint, so it is cancelled at once (no notice, no leave, no waiting facility job)
    fake.claims = {"n5"}
    queued = [j for j in fake.blocks_to_job_id.values() if j not in fake.running and j not in fake.cancelled]
    fake.running[queued[0]] = ("n5", None)
    assert step() == [] and queued[0] in fake.cancelled
    pool.stop()
    assert set(fake.cancelled) >= {"101", "102"}


def test_the_schedulers_early_walltime_signal_does_not_end_a_pilot_whose_end_is_known():
    """Slurm sends --signal=B:USR1@notice up to 60 s early: on a 1-minute pilot that is as it joins. The pool
    gives a pilot its walltime notice from the walltime it knows; the scheduler's signal counts only for a
    pilot whose end it does not know."""
    clock, fake, pool = _fake_pool(max_nodes=2, probe_s=1.0, poll_s=0.0)

    def step(dt=1.0):
        clock["t"] += dt
        return [(e.kind, e.nodes) for e in pool.poll()]
    fake.holes_n = 2
    step()
    fake.running["100"] = ("n7", clock["t"] + 60)        # a 1-minute pilot, its walltime signal already in
    fake.running["101"] = ("n8", None)                    # a pilot whose end the scheduler does not say
    fake.managers.update({"0", "1"})
    fake.walltime_marks.update({"100", "101"})
    assert step() == [("join", ("n7", "n8"))]
    assert step() == [("notice", ("n8",))]               # its signal is all it has
    assert step(30) == [] and pool.states()["100"] == PilotState.RUNNING
    assert step(10) == [("notice", ("n7",))]              # notice_s (20 s) before the walltime it knows


def test_scheduler_commands_per_minute_do_not_grow_with_the_number_of_pilots(tmp_path):
    """One survey per poll cycle serves hole discovery, claims, placement and Parsl's status poller: 1 pilot or
    8, the same whole-cluster queries a minute, within the stated budget (2 per poll_s + reservations once a
    minute)."""
    per_minute = {}
    for n in (1, 8):
        clock = {"t": 1_800_000_000.0}
        cluster = CannedCluster(lambda: clock["t"])
        prov = SlurmPilotProvider("debug", commands=SlurmCommands(cluster), script_dir=str(tmp_path / str(n)),
                                  poll_s=5)
        prov.clock = lambda: clock["t"]
        executor = CannedExecutor(prov, cluster)
        pool = PilotPool(executor, max_nodes=n, probe_s=5.0, poll_s=1.0, clock=lambda: clock["t"], hold=no_hold)
        pool.start()
        for second in range(600):                # ten minutes: the pool every second, Parsl's poller every 5 s
            clock["t"] += 1.0
            pool.poll()
            if second % prov.status_polling_interval == 0 and executor.blocks_to_job_id:
                prov.status(list(executor.blocks_to_job_id.values()))
        assert sum(j["state"] == "RUNNING" for j in cluster.jobs.values()) == n
        steady = [name for t, name in cluster.log if t > clock["t"] - 300]     # the last five minutes
        per_minute[n] = {name: steady.count(name) / 5 for name in set(steady)}
    assert per_minute[1] == per_minute[8], per_minute
    budget = 2 * 60 / 5 + 1
    assert sum(per_minute[8].values()) <= budget, per_minute[8]


def test_a_restarted_orchestrator_cancels_the_pilots_its_dead_predecessor_left(tmp_path):
    """Each run records its pilots beside their scripts (runinfo/<run>/submit_scripts/pilots-<executor>). An
    orchestrator killed outright gives nothing back: the next run of the state directory cancels what the
    scheduler still queues or runs of those (a queued one would start on a hole for nobody), once."""
    clock = {"t": 1_800_000_000.0}
    cluster = CannedCluster(lambda: clock["t"])

    def pool_of_run(run):
        prov = SlurmPilotProvider("debug", commands=SlurmCommands(cluster),
                                  script_dir=str(tmp_path / "runinfo" / run / "submit_scripts"))
        prov.clock = lambda: clock["t"]
        pool = PilotPool(CannedExecutor(prov, cluster), max_nodes=3, probe_s=1.0, poll_s=1.0, clock=lambda: clock["t"],
                         hold=no_hold)
        pool.start()
        return pool

    dead = pool_of_run("000")
    for _ in range(3):
        clock["t"] += 1.0
        dead.poll()
    ours = sorted(dead.executor.blocks_to_job_id.values())
    assert len(ours) == 3
    cluster.jobs[ours[0]]["state"] = "PENDING"                   # still queued when its orchestrator died
    cluster.jobs[ours[1]]["state"] = "COMPLETED"                 # ended on its own
    cluster.jobs["99"] = {"state": "RUNNING", "node": "n16", "nodes": ["n16"], "start": clock["t"]}  # a user's
    before = len([c for _, c in cluster.log if c == "scancel"])
    clock["t"] += 60.0
    pool_of_run("001")                                           # the restarted orchestrator's pool
    # the queued one is cancelled, the running one given back (it ends itself: COMPLETED)
    assert {j: cluster.jobs[j]["state"] for j in ours} == {ours[0]: "CANCELLED", ours[1]: "COMPLETED",
                                                           ours[2]: "COMPLETED"}
    assert cluster.jobs["99"]["state"] == "RUNNING"
    assert (tmp_path / "runinfo" / "000" / "submit_scripts" / "pilots-canned.done").exists()
    after = len([c for _, c in cluster.log if c == "scancel"])
    assert after == before + 2                                   # one scancel each way
    pool_of_run("002")                                           # once: the ledger is done
    assert len([c for _, c in cluster.log if c == "scancel"]) == after


def capped_pool(tmp_path, job_limit: int):
    """A PilotPool (up to 8 nodes) with a real Slurm provider on a canned cluster that caps our jobs, on a test
    clock: (clock, cluster, provider, pool)."""
    clock = {"t": 1_800_000_000.0}
    cluster = CannedCluster(lambda: clock["t"], job_limit=job_limit)
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(cluster), script_dir=str(tmp_path))
    prov.clock = lambda: clock["t"]
    pool = PilotPool(CannedExecutor(prov, cluster), max_nodes=8, probe_s=1.0, poll_s=1.0, clock=lambda: clock["t"],
                     hold=no_hold)
    pool.start()
    return clock, cluster, prov, pool


def test_pilots_respect_the_facility_cap_on_jobs_per_user(tmp_path):
    clock, cluster, _, pool = capped_pool(tmp_path, 3)
    for _ in range(30):
        clock["t"] += 1.0
        pool.poll()
    assert len(cluster.jobs) == 3 and sum(name == "sacctmgr" for _, name in cluster.log) == 1


def test_capped_jobs_pack_holes_into_multi_node_pilots(tmp_path):
    """Capped at 2 jobs, 8 nodes wanted: two 4-node pilots, each starting a worker pool per node with srun; their
    nodes join once every node's worker pool connected."""
    clock, cluster, prov, pool = capped_pool(tmp_path, 2)
    joined = []
    for _ in range(10):
        clock["t"] += 1.0
        joined += [n for e in pool.poll() if e.kind == "join" for n in e.nodes]
    assert [len(j["nodes"]) for j in cluster.jobs.values()] == [4, 4]
    assert all("srun --nodes=4 --ntasks=4 --ntasks-per-node=1 pool" in j["script"] for j in cluster.jobs.values())
    assert sorted(joined, key=lambda x: int(x[1:])) == [f"n{i}" for i in range(1, 9)]
    cluster.jobs["101"]["state"] = "CANCELLED"          # one pilot ends: all four of its nodes leave together
    prov.snapshot(max_age_s=0)
    clock["t"] += 1.0
    left = [e.nodes for e in pool.poll() if e.kind == "leave"]
    assert left == [("n1", "n2", "n3", "n4")]


def test_a_pilot_on_notice_is_given_back_once_the_orchestrator_is_done_with_it():
    """A pilot whose walltime is about to end gets its notice; once what ran there has checkpointed, the
    orchestrator releases the node: the pilot is cancelled now (not at its time limit), so a replacement can
    start on the node."""
    clock, fake, pool = _fake_pool(max_nodes=1, probe_s=100.0, poll_s=0.0)
    _one_pilot_joined(clock, fake, pool, walltime_s=30)
    clock["t"] += 15                                     # within notice_s (20 s) of its end
    assert [(e.kind, e.why) for e in pool.poll()] == [("notice", "walltime ends")]
    pool.release({"n8"})                                 # not its node: nothing happens
    clock["t"] += 1
    pool.poll()
    assert fake.cancelled == []
    pool.release({"n7"})
    assert fake.cancelled == ["100"], "the pilot waited for the next poll: its facility job would too"


def test_pilots_go_to_holes_group_by_group_each_group_its_own_executor(tmp_path):
    """16 nodes in 4 switches of 4; a facility job leaves holes n4 (s0) and n7, n8 (s1). Pilots are aimed at
    hole nodes, the switch with the most holes first, and each switch's pilots run under an executor of their
    own: that is where a task planned on one of its nodes goes."""
    clock = {"t": 1_800_000_000.0}
    cluster = CannedCluster(lambda: clock["t"])
    cluster.jobs["1"] = {"state": "RUNNING", "node": "n[1-3],n[5-6],n[9-16]", "start": clock["t"], "nodes": [
        f"n{i}" for i in (1, 2, 3, 5, 6, *range(9, 17))]}
    prov = SlurmPilotProvider("debug", commands=SlurmCommands(cluster), script_dir=str(tmp_path))
    prov.clock = lambda: clock["t"]
    topo = Topology({f"n{i}": f"s{(i - 1) // 4}" for i in range(1, 17)})
    lanes = {}

    def new_executor(label):
        lanes[label] = CannedExecutor(prov, cluster, label)
        return lanes[label]
    base = CannedExecutor(prov, cluster, "site")
    pool = PilotPool(base, max_nodes=8, probe_s=1.0, poll_s=1.0, clock=lambda: clock["t"], topology=topo, hold=no_hold,
                     new_executor=new_executor)
    pool.demand = 2
    pool.start()

    def joined(polls=6):
        out = []
        for _ in range(polls):
            clock["t"] += 1.0
            out += [n for e in pool.poll() if e.kind == "join" for n in e.nodes]
        return sorted(out)
    assert joined() == ["n7", "n8"] and not lanes          # two nodes wanted: both in s1, the base executor's
    assert all("--nodelist=" in cluster.jobs[j]["script"] for j in base.blocks_to_job_id.values())
    pool.demand = 4
    assert joined() == ["n4"]                             # the one hole left: s0, under a new executor
    (label,) = lanes
    assert {n: pool.executor_label(n) for n in ("n4", "n7", "n8")} == {"n4": label, "n7": "site", "n8": "site"}
    assert pool.executor_label("n1") is None               # not ours: the pool's own executor
    cluster.jobs["1"]["state"] = "COMPLETED"               # the facility job ends: holes everywhere; one more
    cluster.jobs["1"]["nodes"] = []                        # node goes to a switch we hold (s2, s3 have more)
    assert joined() == ["n1"] and pool.executor_label("n1") == label
    # s0's pilots end and a facility job takes s0 and s1's other holes: the two nodes wanted next are in s2, a
    # group new to us, under s0's lane (no pilot left there), not a third interchange
    for j in [j for j, r in cluster.jobs.items() if set(r["nodes"]) & {"n1", "n4"}]:
        cluster.jobs[j]["state"] = "COMPLETED"
    cluster.jobs["2"] = {"state": "RUNNING", "node": "n[1-6]", "start": clock["t"],
                         "nodes": [f"n{i}" for i in range(1, 7)]}
    assert joined() == ["n10", "n9"] and list(lanes) == [label]
    assert {pool.executor_label(n) for n in ("n9", "n10")} == {label} and pool.executor_label("n7") == "site"


def test_pilot_submissions_stay_under_the_cap_per_minute():
    """Holes that open and close fast (here each pilot is withdrawn as soon as it is queued) made 28 pilots in 5
    minutes for one job; with ``max_per_minute`` the pool submits at most that many in any 60 s, and goes on
    submitting once the minute has passed."""
    clock, fake, pool = _fake_pool(max_nodes=8, probe_s=1.0, poll_s=0.0, max_per_minute=5)
    fake.holes_n = 8
    submitted = []
    for _ in range(150):
        clock["t"] += 1.0
        before = len(fake.blocks_to_job_id)
        pool.poll()
        submitted += [clock["t"]] * (len(fake.blocks_to_job_id) - before)
        fake.cancelled += [j for j in fake.blocks_to_job_id.values() if j not in fake.cancelled]   # holes closed
    assert max(sum(t <= u < t + 60 for u in submitted) for t in submitted) == 5
    assert submitted == [1001.0] * 5 + [1061.0] * 5 + [1121.0] * 5


def test_a_pilot_the_plan_leaves_unused_is_given_back_after_the_bound():
    """Two of four held pilots sat unused for 9 minutes (the job trained on 2 nodes), charged to the account: a
    joined pilot none of whose nodes the plan gives a job for ``unused_s`` gets a notice and goes once the
    orchestrator lets it go; one the plan uses again in time stays."""
    clock, fake, pool = _fake_pool(max_nodes=2, probe_s=600.0, poll_s=0.0, release_s=3.0, unused_s=300.0)
    fake.holes_n = 2
    pool.poll()
    fake.running["100"], fake.running["101"] = ("n7", math.inf), ("n8", math.inf)
    fake.managers = {"0", "1"}

    def step(dt, in_use):
        clock["t"] += dt
        pool.in_use = in_use
        return [(e.kind, e.nodes, e.why) for e in pool.poll()]
    assert step(1, set()) == [("join", ("n7", "n8"), "")]
    assert step(1, {"n7"}) == []                         # running: n8 unused from now
    assert step(298, set()) == []                        # n8 unused for 298 s: kept; n7 unused from now
    assert step(2, set()) == [("notice", ("n8",), "unused by the plan")]
    pool.release({"n8"})                                 # the orchestrator: nothing ran there
    assert step(1, {"n7"}) == [("leave", ("n8",), "")] and fake.cancelled == ["101"]
    assert step(400, {"n7"}) == []                       # planned for a job: never unused
    assert pool.states()["100"] == PilotState.RUNNING


def test_a_pilots_walltime_notice_comes_as_late_as_the_measured_stops_allow():
    """Before any stop is measured a pilot gets its walltime notice notice_s (20 s) ahead; once the orchestrator
    says a stop takes 1.5 s, 2 x 1.5 + 3 polls (1 s each) = 6 s ahead, so a 1-minute pilot trains 14 s longer.
    A slow stop never pushes the notice past notice_s."""
    clock, fake, pool = _fake_pool(max_nodes=1, probe_s=100.0, poll_s=1.0)
    assert pool.walltime_lead_s() == 20.0
    pool.stop_s = 1.5
    assert pool.walltime_lead_s() == 6.0
    _one_pilot_joined(clock, fake, pool, walltime_s=60)
    clock["t"] += 52                                     # 7 s left: 20 s ahead would have been 12 s ago
    assert pool.poll() == []
    clock["t"] += 1.5
    assert [(e.kind, e.why) for e in pool.poll()] == [("notice", "walltime ends")]
    pool.stop_s = 60.0
    assert pool.walltime_lead_s() == 20.0


def test_a_stop_counts_a_whole_step_so_the_first_one_seen_at_a_steps_end_does_not_shorten_the_notice():
    """A replay's first stop (0.23 s) came at the end of a 2.5 s step; the notice's lead learnt from it (3.5 s)
    was too short for the next stop, asked mid-step (1.85 s + the pilot's end): the pilot reached its walltime."""
    from parsl_bft.execution.checkpoint_policy import CheckpointPolicy
    policy = CheckpointPolicy()
    policy.observe_stop(None, 10.0, step_s=2.5)           # not asked: nothing learnt
    assert policy.stop_s is None
    policy.observe_stop(100.0, 100.23, step_s=2.5)
    assert policy.stop_s == pytest.approx(2.73)
    _, _, pool = _fake_pool(max_nodes=1, probe_s=100.0, poll_s=1.0)
    pool.stop_s = policy.stop_s
    assert pool.walltime_lead_s() == pytest.approx(2 * 2.73 + 3)   # > 1.85 s + the pilot's end + the polls
