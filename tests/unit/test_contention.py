"""The ring-all-reduce cost model (eqs. 6-8), the slotted engine, SJF-BCO and its baselines, the exact MILP."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parsl_bft.planner.contention import (
    Baseline,
    CommParams,
    Instance,
    JobOrder,
    Schedule,
    Start,
    binding_instance,
    contention,
    degradation,
    faithful_instance,
    first_fit,
    first_fit_backfill,
    iteration_time,
    iterations_per_slot,
    list_scheduling,
    lower_bound,
    paper_baseline,
    paper_instance,
    random_placement,
    random_servers,
    run,
    sjf_bco,
    sjf_bco_trial,
)
from parsl_bft.planner.contention.booking import capped_schedule, job_order, least_busy
from parsl_bft.planner.contention.milp import options, solve_optimal

P = CommParams(alpha=0.5, xi1=1.0, xi2=1.0, b_intra=10.0, b_inter=1.0, reduce_speed=100.0, overhead=1e-3)


# --- model -----------------------------------------------------------------------------------------------------
def test_job_inside_one_server_by_hand():
    assert contention([[False, False]]).tolist() == [0]        # y = (4, 0): not split anywhere
    # (m/w) 2 (w-1) / b_i + (m/w) (w-1) / C + xi2 * overhead * 1 + compute, m = 8, w = 4
    expect = 2 * 2 * 3 / 10 + 2 * 3 / 100 + 1e-3 + 0.01
    assert iteration_time(4, 1, 0, 8.0, 0.01, P) == pytest.approx(expect)
    assert iteration_time(1, 1, 0, 8.0, 0.01, P) == pytest.approx(1e-3 + 0.01)   # one worker: no ring


def test_two_jobs_split_over_the_same_two_servers_by_hand():
    p = contention([[True, True], [True, True]])
    assert p.tolist() == [2, 2]
    # k = 2, f = 2 + 0.5 (2 - 1) = 2.5, B = b_e / 2.5 = 0.4; two servers of overhead
    expect = 2 * 2 * 3 / 0.4 + 2 * 3 / 100 + 2e-3 + 0.01
    assert iteration_time(4, 2, p, 8.0, 0.01, P) == pytest.approx([expect, expect])
    # the second job inside server 1 instead: the first is alone on its links
    assert contention([[True, True], [False, False]]).tolist() == [1, 0]
    # an inactive split job neither counts nor is counted
    assert contention([[True, True], [True, True]], active=[True, False]).tolist() == [1, 0]
    # p is the max over the servers a job is split on
    assert contention([[True, True, False], [False, True, True], [False, True, True]]).tolist() == [3, 3, 3]
    assert contention([[True, True, False], [False, False, False]]).tolist() == [1, 0]


def test_monotone_in_contention_and_spread():
    ps = np.arange(1, 12)
    tau = iteration_time(8, 2, ps, 4.0, 0.02, P)
    assert np.all(np.diff(tau) > 0)
    spans = np.arange(2, 9)
    assert np.all(np.diff(iteration_time(8, spans, 2, 4.0, 0.02, P)) > 0)
    assert iteration_time(8, 2, 1, 4.0, 0.02, P) > iteration_time(8, 1, 0, 4.0, 0.02, P)
    assert np.all(np.diff(iterations_per_slot(tau)) <= 0)


def test_degradation_floor_and_parameter_checks():
    assert degradation(1.0, 3.0) == 1.0 and degradation(0.5, 3.0) == 1.0 and degradation(3.0, 1.0) == 5.0
    half = CommParams(xi1=0.5)
    assert iteration_time(4, 2, 2, 1.0, 0.0, half) < iteration_time(4, 2, 2, 1.0, 0.0, CommParams())
    with pytest.raises(ValueError, match="xi1"):
        CommParams(xi1=0)
    with pytest.raises(ValueError, match="b_inter"):
        CommParams(b_inter=0)


# --- engine ----------------------------------------------------------------------------------------------------
def _inst(server_gpus, gpus, iters, grad, compute, params=P) -> Instance:
    return Instance(np.array(server_gpus), np.array(gpus), np.array(iters), np.array(grad, float),
                    np.array(compute, float), params)


def test_engine_by_hand():
    # two 2-GPU jobs on two 2-GPU servers; tau inside a server 0.101 + 0.001 -> 9 it/slot; split with p = 2:
    # (0.5) 2 / 0.4 + ... -> 0.4 it/slot floored to 1 (never below one)
    inst = _inst([2, 2], [2, 2], [18, 18], [0.01, 0.01], [0.1, 0.1])
    packed = run(inst, Schedule([0, 1], [np.array([0, 1]), np.array([2, 3])]))
    ips = int(iterations_per_slot(iteration_time(2, 1, 0, 0.01, 0.1, P)))
    assert packed.end.tolist() == [math.ceil(18 / ips)] * 2
    split = run(inst, Schedule([0, 1], [np.array([0, 2]), np.array([1, 3])]))
    ips2 = int(iterations_per_slot(iteration_time(2, 2, 2, 0.01, 0.1, P)))
    assert ips2 < ips and split.end.tolist() == [math.ceil(18 / ips2)] * 2
    # sharing a GPU serialises: job 1 starts when job 0 ends
    seq = run(inst, Schedule([0, 1], [np.array([0, 1]), np.array([1, 2])]))
    assert seq.start[1] == seq.end[0] and seq.makespan == seq.end[1]


def test_engine_fifo_and_bad_schedules():
    inst = _inst([3], [2, 1, 1], [8, 4, 4], [0, 0, 0], [0.49, 0.49, 0.49])   # 2 it/slot each
    gp = [np.array([0, 1]), np.array([0]), np.array([2])]
    # job 1 waits for job 0's GPU 0; job 2's GPU is free at once: it starts at 0 - unless first-come-first-served
    assert run(inst, Schedule([0, 1, 2], gp)).start.tolist() == [0, 4, 0]
    assert run(inst, Schedule([0, 1, 2], gp, fifo=True)).start.tolist() == [0, 4, 4]
    with pytest.raises(ValueError, match="every job exactly once"):
        run(inst, Schedule([0, 1], gp))
    with pytest.raises(ValueError, match="job 0: needs 2 distinct"):
        run(inst, Schedule([0, 1, 2], [np.array([0, 0]), gp[1], gp[2]]))


# --- policies on tiny instances with known optima ----------------------------------------------------------------
def test_sjf_bco_packs_where_baselines_split():
    # two servers of 4; a 1-GPU job arrives first, then two 4-GPU jobs. Optimum: each big job alone in a server,
    # the small one after (or before) one of them: no split, no contention
    inst = _inst([4, 4], [1, 4, 4], [20, 20, 20], [0.0, 2.0, 2.0], [0.1, 0.1, 0.1])
    ls = run(inst, list_scheduling(inst))
    bco = sjf_bco(inst, horizon=100)
    opt = solve_optimal(inst, ls.makespan)
    assert bco.outcome.makespan == opt.makespan
    assert ls.makespan > opt.makespan            # LS splits a big job around the small one


def test_sjf_bco_known_optimum_small_then_large():
    # one server of 4: four 1-GPU jobs and one 4-GPU job must be serialised; optimum = longest small + big
    inst = _inst([4], [1, 1, 4, 1, 1], [10, 20, 10, 30, 10], [0] * 5, [0.249] * 5)   # 4 it/slot
    bco = sjf_bco(inst, horizon=50)
    assert bco.outcome.makespan == math.ceil(30 / 4) + math.ceil(10 / 4)
    assert solve_optimal(inst, bco.outcome.makespan).makespan == bco.outcome.makespan


def test_sjf_bco_trial_infeasible_cap_and_kappa_rule():
    inst = _inst([4, 4], [2, 2, 4], [10, 10, 10], [1.0, 1.0, 1.0], [0.1, 0.1, 0.1])
    assert sjf_bco_trial(inst, theta=0.5, kappa=4) is None          # no GPU can take any job under theta
    # kappa >= 4: the 4-GPU job takes the least busy GPUs (the 4 the 2-GPU jobs left, packed on one server);
    # kappa < 4: LBSGF takes the least busy server - the same GPUs here: both never split it
    for k in (2, 4):
        s = sjf_bco_trial(inst, theta=1e9, kappa=k)
        assert len(set((s.gpus[2] // 4).tolist())) == 1
    with pytest.raises(ValueError, match="lambda"):
        sjf_bco(inst, lam=0.5)


def test_lbsgf_lambda_widens_the_choice():
    # servers of 4, 4, 8 GPUs; server 2 busy with a long 8-GPU job; a 4-GPU job with kappa = 1 and lambda = 1
    # takes the least busy server; lambda = 3 looks at servers holding 12 GPUs and still picks idle GPUs
    inst = _inst([4, 4, 8], [8, 4], [100, 10], [1.0, 1.0], [0.1, 0.1])
    for lam in (1.0, 3.0):
        s = sjf_bco_trial(inst, theta=1e9, kappa=1, lam=lam)
        assert set((inst.server_of[s.gpus[1]]).tolist()).isdisjoint(inst.server_of[s.gpus[0]].tolist())


def test_baselines_semantics():
    inst = _inst([2, 2], [1, 2, 1], [4, 4, 4], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5])
    ff = first_fit(inst)
    assert ff.fifo and ff.gpus[0].tolist() == [0] and ff.gpus[1].tolist() == [2, 3]   # fewest servers, first fit
    bf = first_fit_backfill(inst)
    assert not bf.fifo and bf.gpus[1].tolist() == [1, 2]        # any first free GPUs, server by server
    big = paper_instance(5, servers=6)
    ff = first_fit(big)
    for j in range(big.n_jobs):
        assert len(set(big.server_of[ff.gpus[j]].tolist())) == big.min_servers(j)
    ls = list_scheduling(inst)
    assert ls.gpus[2].tolist() == [3]                           # least booked work
    a, b = random_placement(inst, seed=1), random_placement(inst, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a.gpus, b.gpus))
    # random servers: a job that fits one server stays on one (the fewest in the drawn order), and it waits
    # for that server's GPUs even when GPUs on the other server are free
    r = [random_servers(big, seed=s) for s in range(3)]
    assert all(len(set(big.server_of[x.gpus[j]].tolist())) == 1 for x in r for j in range(big.n_jobs)
               if big.gpus[j] <= big.server_gpus.min())
    assert len({tuple(big.server_of[x.gpus[0]].tolist()) for x in r}) > 1
    one = _inst([2, 2], [2, 2, 1], [4, 4, 4], [1.0, 1.0, 0.0], [0.5, 0.5, 0.5])
    waits = [run(one, random_servers(one, seed=s)).makespan for s in range(20)]
    assert min(waits) < max(waits)                              # both 2-GPU jobs on one server: one waits


def test_sjf_bco_within_bound_of_optimum_on_small_random_instances():
    ratios = []
    for seed in range(4):
        inst = paper_instance(seed, servers=2, mix={1: 2, 2: 1, 4: 1}, iters=(3, 8), tau=(0.2, 0.5),
                              server_choices=(2, 4))
        bco = sjf_bco(inst, horizon=60).outcome.makespan
        opt = solve_optimal(inst, bco)
        assert opt.makespan <= bco
        assert opt.makespan <= min(run(inst, f(inst)).makespan for f in (first_fit, list_scheduling))
        ratios.append(bco / opt.makespan)
    assert max(ratios) <= 1.5


def test_milp_options_and_schedule():
    # inside one server 3 it/slot, split over both 2 (the all-reduce crosses servers): only (0, 3) reaches 2 slots
    inst = _inst([2, 4], [3], [5], [0.02], [0.32])
    assert [int(iterations_per_slot(iteration_time(3, k, 0, 0.02, 0.32, P))) for k in (1, 2)] == [3, 2]
    assert sorted(options(inst, 0)) == [(0, 3), (1, 2), (2, 1)]
    r = solve_optimal(inst, 10)
    assert r.makespan == math.ceil(5 / 3) and run(inst, r.schedule).makespan == r.makespan
    assert len(set(inst.server_of[r.schedule.gpus[0]].tolist())) == 1          # inside the 4-GPU server


def test_paper_instance_shape():
    inst = paper_instance(3)
    assert inst.n_jobs == 160 and inst.n_servers == 20
    assert sorted(np.unique(inst.gpus).tolist()) == [1, 2, 4, 8, 16, 32]
    tau1 = iteration_time(inst.gpus, 1, 0, inst.grad, inst.compute, inst.params)
    assert tau1.min() >= 0.01 - 1e-12 and tau1.max() <= 0.05 + 1e-12
    many = inst.gpus > 1
    ref = iteration_time(inst.gpus[many], 2, 4, inst.grad[many], inst.compute[many], inst.params)
    assert ref / tau1[many] == pytest.approx(np.full(many.sum(), 1.15))


# --- the paper's generator, its baselines, bounds --------------------------------------------------------------
def test_cap_clips_contention_and_overhead():
    capped = CommParams(max_extra=0.15)
    free = iteration_time(8, 1, 0, 4.0, 0.02, capped)
    assert free == pytest.approx(iteration_time(8, 1, 0, 4.0, 0.02, CommParams()))     # inside: untouched
    worst = iteration_time(8, 6, 40, 4.0, 0.02, capped)
    assert worst == pytest.approx(1.15 * free) and iteration_time(8, 6, 40, 4.0, 0.02, CommParams()) > worst
    with pytest.raises(ValueError, match="max_extra"):
        CommParams(max_extra=-0.1)


def test_faithful_instance_as_the_paper_states_it():
    inst = faithful_instance(4)
    assert inst.n_jobs == 160 and inst.params.max_extra == 0.15
    tau1 = iteration_time(inst.gpus, 1, 0, inst.grad, inst.compute, inst.params)
    assert tau1.min() >= 0.01 - 1e-12 and tau1.max() <= 0.05 + 1e-12
    assert inst.iters.min() >= 1000 and inst.iters.max() <= 6000
    rho = tau1 * inst.iters
    assert rho.min() >= 50 - 0.05 * 0.5 and rho.max() <= 300 + 0.05 * 0.5       # F rounded to an integer
    slots = np.array([inst.slots(j, 1, 0) for j in range(inst.n_jobs)])
    assert np.all(slots >= np.floor(rho)) and np.all(slots <= np.ceil(rho * 1.05) + 1)
    many = inst.gpus > 1   # any spread and contention: at most 15% over the one-server time
    for servers, p in ((2, 1), (2, 4), (5, 30)):
        t = iteration_time(inst.gpus[many], servers, p, inst.grad[many], inst.compute[many], inst.params)
        assert np.all(t <= 1.15 * tau1[many] + 1e-12)
    assert np.allclose(iteration_time(inst.gpus[many], 2, 4, inst.grad[many], inst.compute[many], inst.params),
                       1.15 * tau1[many])                                     # the calibration point reaches it
    with pytest.raises(ValueError, match="rho-hat"):
        faithful_instance(0, rho=(5.0, 300.0))


def test_paper_baselines_semantics():
    inst = _inst([2, 2], [1, 2, 1], [4, 4, 4], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5])
    first = capped_schedule(inst, [0, 1, 2], 1e9, lambda b, j, el: el[: int(inst.gpus[j])])
    ff = paper_baseline(inst, Baseline.FF, horizon=20)       # its bisected theta keeps GPU 0 from the 2-GPU job
    assert first.gpus[1].tolist() == [0, 1] and ff.schedule.gpus[1].tolist() == [1, 2]
    assert ff.theta < 20 and ff.outcome.makespan < run(inst, first).makespan
    assert job_order(inst, JobOrder.SJF) == [0, 2, 1] and job_order(inst, JobOrder.ARRIVAL) == [0, 1, 2]
    ls = paper_baseline(inst, Baseline.LS, JobOrder.SJF, horizon=20)
    assert ls.schedule.order == [0, 2, 1] and ls.schedule.gpus[2].tolist() == [1]           # least booked work
    # List-Scheduling's rule is FA-FFP's: SJF-BCO with kappa >= every job is LS in SJF order, trial by trial
    big = faithful_instance(1, servers=6, mix={1: 6, 2: 3, 4: 3, 8: 2})
    for theta in (200.0, 400.0, 1e9):
        a = sjf_bco_trial(big, theta, kappa=8)
        b = capped_schedule(big, job_order(big, JobOrder.SJF), theta,
                            lambda bk, j, el: least_busy(bk, el, int(big.gpus[j])))
        assert (a is None) == (b is None)
        assert a is None or all(np.array_equal(x, y) for x, y in zip(a.gpus, b.gpus))
    r1, r2 = (paper_baseline(big, Baseline.RAND, seed=3) for _ in range(2))
    assert r1.theta == 1200 and all(np.array_equal(x, y) for x, y in zip(r1.schedule.gpus, r2.schedule.gpus))


def test_wait_start_keeps_the_order_and_waits_for_idle_gpus():
    # one server of 2; a 1-GPU job, a 2-GPU job, a 1-GPU job: under WAIT the last waits for the 2-GPU job
    inst = _inst([2], [1, 2, 1], [4, 4, 4], [0.0, 0.0, 0.0], [0.49, 0.49, 0.49])         # 2 it/slot: 2 slots
    pick = lambda b, j, el: el[: int(inst.gpus[j])]                                      # noqa: E731
    wait = capped_schedule(inst, [0, 1, 2], 1e9, pick, start=Start.WAIT)
    assert wait.fifo and run(inst, wait).start.tolist() == [0, 2, 4]
    book = capped_schedule(inst, [0, 1, 2], 1e9, pick, start=Start.BOOK)
    assert not book.fifo and book.gpus[2].tolist() == [0] and run(inst, book).start.tolist() == [0, 2, 4]
    b = sjf_bco(faithful_instance(2, servers=4, mix={1: 4, 2: 2, 4: 2}), start=Start.WAIT)
    assert b.schedule.fifo and b.outcome.start[b.schedule.order].tolist() == sorted(b.outcome.start.tolist())


def test_lower_bound_and_binding_instances():
    inst = binding_instance(3)
    assert inst.n_servers == 3 and inst.n_jobs == 6 and inst.gpus.max() == 8 and inst.n_gpus <= 16
    assert inst.gpus.sum() > 1.5 * inst.n_gpus and set(inst.server_gpus.tolist()) <= {4, 8}
    bco = sjf_bco(inst, horizon=100).outcome.makespan
    opt = solve_optimal(inst, bco, time_limit=60)
    assert lower_bound(inst) <= opt.makespan <= bco
    assert run(inst, opt.schedule).makespan >= opt.makespan
    big = faithful_instance(0)
    assert lower_bound(big) <= min(run(big, f(big)).makespan for f in (list_scheduling, first_fit))


def test_milp_refuses_an_unproven_optimum():
    with pytest.raises(RuntimeError, match=r"optimal|Solved"):
        solve_optimal(binding_instance(1), 7, time_limit=0.05)


def test_benchmark_smoke(tmp_path):
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "contention.py"), "--smoke", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=True)
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["faithful"] is True
    for k in ("order_frac", "ratio_ls", "ratio_ls_sjf", "ratio_ff", "ratio_rand", "jct_bco_le_ls", "opt_gap_p95",
              "pays", "calibrated", "start_wait"):
        assert k in last
    assert (tmp_path / "policies.png").exists()
