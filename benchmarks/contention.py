"""Reproduce SJF-BCO's evaluation (Yu et al., MobiHoc 2022, section 7) in the paper's slotted offline setting.

A. The paper's generator (``faithful_instance``: rho-hat ~ U[50, 300], contention + overhead capped at 15%):
   160 jobs on 20 servers, per seed SJF-BCO against FF, LS and RAND as the paper defines them (each under its
   own busy-time cap theta; RAND at theta = T), every baseline in arrival order and in SJF order, and a lower
   bound on the makespan;
A2. ablations: SJF-BCO's placement in arrival order; the other start reading (``Start.WAIT``);
A3. sensitivity: the calibrated reading (``paper_instance``: no cap, rho-hat 10-300); with --generator calibrated
   the roles swap (the headline on the calibrated reading, A3 on the paper's generator);
B. kappa sweep; C. lambda sweep (kappa = 1); D. 10 / 15 / 20 servers (horizon 1500);
E. optimality gap on small instances where contention binds (3 servers of 4/8 GPUs, 6 jobs of up to 8 GPUs;
   exact MILP, only instances HiGHS proves optimal count);
F. where contention-aware placement pays: LS in SJF order / SJF-BCO with a higher communication share, with
   more GPUs per job, and both.
Plots go to out/contention/. LAST line: one JSON object.
Usage: python benchmarks/contention.py [--generator faithful|calibrated] [--cap 0.15] [--seeds 30] [--sweep-seeds 10]
       [--small 12] [--milp-limit 20] [--quick] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from parsl_bft.planner.contention import (
    PAPER_MIX,
    POLICIES,
    Baseline,
    JobOrder,
    Start,
    binding_instance,
    faithful_instance,
    lower_bound,
    paper_baseline,
    paper_instance,
    run,
    sjf_bco,
)
from parsl_bft.planner.contention.milp import solve_optimal

NAMES = ("sjf-bco", "ls", "ls-sjf", "ff", "ff-sjf", "rand", "rand-sjf")
KAPPAS = (1, 2, 4, 8, 10, 16, 32)
LAMBDAS = (1, 2, 4, 8)
SERVERS = (10, 15, 20)
PAPER = {"sjf-bco": 533, "ls": 594, "ff": 718, "rand": 1127}


def policies(inst, seed: int, horizon: int, start: Start = Start.BOOK, extra: bool = False) -> dict:
    """Makespan and mean JCT of SJF-BCO and of every baseline in both orders on one instance."""
    t = time.perf_counter()
    b = sjf_bco(inst, horizon=horizon, start=start)
    out: dict = {"sjf-bco": (b.outcome.makespan, b.outcome.mean_jct), "_s": time.perf_counter() - t,
                 "_kappa": b.kappa, "_lb": lower_bound(inst)}
    for which in Baseline:
        for order in JobOrder:
            r = paper_baseline(inst, which, order, horizon=horizon, seed=seed, start=start)
            name = which.value + ("-sjf" if order is JobOrder.SJF else "")
            out[name] = (r.outcome.makespan, r.outcome.mean_jct)
    if extra:        # the earlier readings without a busy-time cap
        for name, f in POLICIES.items():
            o = run(inst, f(inst, seed))
            out["nocap-" + name] = (o.makespan, o.mean_jct)
    return out


def med(rows, name: str, k: int = 0) -> float:
    """Median makespan (k = 0) or mean JCT (k = 1) of ``name`` over rows."""
    return float(np.median([r[name][k] for r in rows]))


def ratio(rows, name: str, base: str = "sjf-bco") -> float:
    """Median over seeds of name's makespan / base's."""
    return round(float(np.median([r[name][0] / r[base][0] for r in rows])), 4)


def summary(rows) -> dict:
    """The headline numbers of one setting."""
    return {"order_frac": round(sum(r["sjf-bco"][0] < r["ls"][0] < r["ff"][0] < r["rand"][0] for r in rows)
                                / len(rows), 3),
            "ratio_ls": ratio(rows, "ls"), "ratio_ls_sjf": ratio(rows, "ls-sjf"), "ratio_ff": ratio(rows, "ff"),
            "ratio_rand": ratio(rows, "rand"), "ratio_ff_sjf": ratio(rows, "ff-sjf"),
            "ratio_rand_sjf": ratio(rows, "rand-sjf"),
            "bco_beats_ls_sjf_frac": round(sum(r["sjf-bco"][0] < r["ls-sjf"][0] for r in rows) / len(rows), 3),
            "jct_bco_le_ls": round(sum(r["sjf-bco"][1] <= r["ls"][1] for r in rows) / len(rows), 3)}


def show(rows, names=NAMES) -> None:
    """One line per policy: median makespan, spread, mean JCT."""
    for p in names:
        mk = [r[p][0] for r in rows]
        print(f"  {p:14} makespan median {np.median(mk):7.1f} (p10 {np.percentile(mk, 10):6.0f}, p90 "
              f"{np.percentile(mk, 90):6.0f})  avg JCT median {med(rows, p, 1):6.1f}  paper ~{PAPER.get(p, '-')}")


def optimality(n: int, time_limit: float, smoke: bool) -> dict:
    """E: SJF-BCO, LS in SJF order and LS / the MILP optimum on binding instances HiGHS proves optimal."""
    kw = {"servers": 2, "jobs": 4, "sizes": (1, 2, 4), "max_gpus": 8} if smoke else {}
    gaps: dict[str, list[float]] = {"sjf-bco": [], "ls-sjf": [], "ls": []}
    unproven, t0 = 0, time.perf_counter()
    for s in range(n):
        inst = binding_instance(s, **kw)
        b = sjf_bco(inst, horizon=100).outcome.makespan
        ls_sjf = paper_baseline(inst, Baseline.LS, JobOrder.SJF, horizon=100).outcome.makespan
        ls = paper_baseline(inst, Baseline.LS, JobOrder.ARRIVAL, horizon=100).outcome.makespan
        try:
            opt = solve_optimal(inst, b, time_limit=time_limit).makespan
        except RuntimeError:
            unproven += 1
            continue
        for name, v in (("sjf-bco", b), ("ls-sjf", ls_sjf), ("ls", ls)):
            gaps[name].append(v / opt)
    g = gaps["sjf-bco"]
    print(f"  proved optimal: {len(g)} of {n} (HiGHS, {time_limit:.0f} s each; {time.perf_counter() - t0:.0f} s)")
    for name, v in gaps.items():
        if v:
            print(f"  {name:8} / optimal: median {np.median(v):.3f}, p95 {np.percentile(v, 95):.3f}, max "
                  f"{max(v):.3f}; optimal on {sum(x == 1.0 for x in v)} of {len(v)}")
    return {"gaps": g, "proved": len(g), "tried": n, "ls_sjf_optimal": sum(x == 1.0 for x in gaps["ls-sjf"]),
            "p95": round(float(np.percentile(g, 95)), 4) if g else None}


def plots(out: Path, main, kappa, lam, servers, gaps, label: str) -> None:
    """policies.png, sweeps.png, optimality_gap.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, k, label in ((axes[0], 0, "makespan (slots)"), (axes[1], 1, "average JCT (slots)")):
        ax.bar(NAMES, [med(main, p, k) for p in NAMES], color="C0", alpha=0.8, label="this reproduction (median)")
        if k == 0:
            ax.plot(["sjf-bco", "ls", "ff", "rand"], [PAPER[p] for p in ("sjf-bco", "ls", "ff", "rand")], "k^",
                    label="paper (read off its plots)")
            ax.legend(fontsize=7)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{label}: 160 jobs, 20 servers, {len(main)} seeds")
    fig.tight_layout()
    fig.savefig(out / "policies.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([str(k) for k in KAPPAS], [np.median(kappa[k]) for k in KAPPAS], "o-", label="this")
    axes[0].plot([str(k) for k in KAPPAS], [626, 565, 541, 535, 700, 749, 736], "k^--", label="paper")
    axes[0].set_xlabel("kappa")
    axes[1].plot([str(v) for v in LAMBDAS], [np.median(lam[v]) for v in LAMBDAS], "o-", label="this")
    axes[1].plot([str(v) for v in LAMBDAS], [1043, 882, 730, 538], "k^--", label="paper")
    axes[1].set_xlabel("lambda (kappa = 1)")
    for p in ("sjf-bco", "ls", "ls-sjf", "ff", "rand"):
        axes[2].plot([str(s) for s in SERVERS], [med(servers[s], p) for s in SERVERS], "o-", label=p)
    axes[2].set_xlabel("servers")
    for ax in axes:
        ax.set_ylabel("median makespan (slots)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sweeps.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.hist(gaps or [1.0], bins=20)
    ax.set_xlabel("SJF-BCO / optimal makespan")
    ax.set_ylabel("instances")
    fig.tight_layout()
    fig.savefig(out / "optimality_gap.png", dpi=120)
    plt.close(fig)


def sweeps(seeds, inst_of) -> tuple[dict, dict]:
    """B and C: SJF-BCO with kappa fixed; with lambda at kappa = 1."""
    print("B. kappa sweep (kappa fixed; 8 and 10 split these job sizes alike)")
    kappa = {k: [sjf_bco(inst_of(s, 20), kappas=[k]).outcome.makespan for s in seeds] for k in KAPPAS}
    print("  " + ", ".join(f"kappa {k}: {np.median(v):.1f}" for k, v in kappa.items()))
    print("C. lambda sweep (kappa = 1)")
    lam = {}
    for v in LAMBDAS:
        lam[v], spans = [], []
        for s in seeds:
            inst = inst_of(s, 20)
            b = sjf_bco(inst, kappas=[1], lam=float(v))
            lam[v].append(b.outcome.makespan)
            spans += [len(np.unique(inst.server_of[g])) for j, g in enumerate(b.schedule.gpus) if inst.gpus[j] > 1]
        print(f"  lambda {v}: median makespan {np.median(lam[v]):7.1f}; servers per multi-GPU job "
              f"{np.mean(spans):.2f}")
    return kappa, lam


def pays(seeds, smoke_kw) -> dict:
    """F: LS in SJF order / SJF-BCO where communication weighs more or jobs are larger."""
    mix = smoke_kw.get("mix", PAPER_MIX)
    big = {2 * g: n for g, n in mix.items()}                # every job twice the GPUs
    settings = {"cap_0.5": ({"cap": 0.5}, 1200), "gpus_x2": ({"mix": big}, 2400),
                "gpus_x2_cap_0.5": ({"mix": big, "cap": 0.5}, 2400)}
    res = {}
    for name, (kw, horizon) in settings.items():
        rows = []
        for s in seeds:
            inst = faithful_instance(s, **{**smoke_kw, **kw})
            b = sjf_bco(inst, horizon=horizon)
            ls = paper_baseline(inst, Baseline.LS, JobOrder.SJF, horizon=horizon)
            rows.append({"sjf-bco": (b.outcome.makespan, 0), "ls-sjf": (ls.outcome.makespan, 0)})
        res[name] = {"ratio_ls_sjf": ratio(rows, "ls-sjf"),
                     "bco_beats_ls_sjf_frac": round(sum(r["sjf-bco"][0] < r["ls-sjf"][0] for r in rows)
                                                    / len(rows), 3)}
        print(f"  {name:16} LS in SJF order / SJF-BCO: median {res[name]['ratio_ls_sjf']:.3f}; SJF-BCO shorter in "
              f"{res[name]['bco_beats_ls_sjf_frac']:.0%} of seeds")
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generator", choices=("faithful", "calibrated"), default="faithful",
                    help="the headline's instances: the paper's generator (faithful_instance) or the calibrated "
                    "reading (paper_instance); the other one is run as the sensitivity (A3)")
    ap.add_argument("--cap", type=float, default=0.15, help="what contention and overhead add at most (faithful: a "
                    "cap; calibrated: reached with 2 servers and 4 contending jobs, not a cap); the paper: 15%%")
    ap.add_argument("--seeds", type=int, default=30, help="seeds of the headline comparison (A)")
    ap.add_argument("--sweep-seeds", type=int, default=10, help="seeds of the ablations, sensitivity and sweeps")
    ap.add_argument("--small", type=int, default=12, help="small binding instances for the optimality gap")
    ap.add_argument("--milp-limit", type=float, default=20.0, help="HiGHS seconds per small instance")
    ap.add_argument("--out", default="out/contention")
    ap.add_argument("--quick", action="store_true", help="5 seeds, 3 for the sweeps, 4 small instances")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long check of the whole path (tiny instances)")
    args = ap.parse_args()
    if args.quick or args.smoke:
        args.seeds, args.sweep_seeds, args.small = (5, 3, 4) if args.quick else (2, 1, 1)
    smoke_kw = {"mix": {1: 4, 2: 2, 4: 2, 8: 1}, "servers": 3} if args.smoke else {}

    is_faithful = args.generator == "faithful"

    def faithful(seed: int, servers: int, paper: bool = is_faithful):
        if paper:
            return faithful_instance(seed, **{"servers": servers, "cap": args.cap, **smoke_kw})
        return paper_instance(seed, **{"servers": servers, "max_extra": args.cap, **smoke_kw})

    seeds, few = range(args.seeds), range(args.sweep_seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    label = "the paper's generator" if is_faithful else "the calibrated reading"
    print(f"A. {label}: 160 jobs, 20 servers, "
          f"{len(seeds)} seeds (horizon 1200; " + ("rho-hat ~ U[50, 300]; contention + overhead <= " if is_faithful
                                                  else "rho-hat 10-300; reaching ") + f"{args.cap:.0%})")
    main_rows = [policies(faithful(s, 20), s, 1200, extra=True) for s in seeds]
    show(main_rows, NAMES + tuple(k for k in main_rows[0] if k.startswith("nocap-")))
    head = summary(main_rows)
    print("  " + ", ".join(f"{k} {v}" for k, v in head.items()))
    lb = [r["sjf-bco"][0] / r["_lb"] for r in main_rows]
    print(f"  SJF-BCO / lower bound: median {np.median(lb):.3f}, max {max(lb):.3f}; SJF-BCO time per instance: "
          f"median {np.median([r['_s'] for r in main_rows]):.2f} s; kappa chosen "
          f"{sorted(set(r['_kappa'] for r in main_rows))}")

    print(f"A2. ablations ({len(few)} seeds)")
    arr = [sjf_bco(faithful(s, 20), order=JobOrder.ARRIVAL).outcome.makespan / main_rows[s]["ls"][0] for s in few]
    print(f"  SJF-BCO's placement in arrival order / LS (arrival order): median {np.median(arr):.3f}")
    wait_rows = [policies(faithful(s, 20), s, 1200, start=Start.WAIT) for s in few]
    wait = summary(wait_rows)
    print("  start = wait for idle GPUs: " + ", ".join(f"{k} {v}" for k, v in wait.items()))

    other = "the calibrated reading (no cap, rho-hat 10-300)" if is_faithful else "the paper's generator"
    print(f"A3. sensitivity: {other}, {len(few)} seeds")
    cal_rows = [policies(faithful(s, 20, not is_faithful), s, 1200) for s in few]
    cal = summary(cal_rows)
    print("  " + ", ".join(f"{k} {v}" for k, v in cal.items()))

    kappa, lam = sweeps(few, faithful)
    print("D. servers (horizon 1500)")
    servers = {20: main_rows[: len(few)]}
    for n in SERVERS[:-1]:
        servers[n] = [policies(faithful(s, n), s, 1500) for s in few]
    for n in SERVERS:
        print(f"  {n:2d} servers: " + ", ".join(f"{p} {med(servers[n], p):.1f}" for p in NAMES) + "; LS / SJF-BCO "
              f"{ratio(servers[n], 'ls'):.3f}, LS in SJF order / SJF-BCO {ratio(servers[n], 'ls-sjf'):.3f}")

    print(f"E. optimality gap on {args.small} small instances where contention binds (exact MILP)")
    gap = optimality(args.small, args.milp_limit, args.smoke)

    print(f"F. where contention-aware placement pays ({len(few)} seeds)")
    pay = pays(few, smoke_kw)
    if is_faithful:
        pay["calibrated_uncapped"] = {k: cal[k] for k in ("ratio_ls_sjf", "bco_beats_ls_sjf_frac")}

    plots(out, main_rows, kappa, lam, servers, gap["gaps"], label)
    print(f"plots: {out / 'policies.png'}, {out / 'sweeps.png'}, {out / 'optimality_gap.png'}")
    table = {"makespan_median": {p: med(main_rows, p) for p in main_rows[0] if not p.startswith("_")},
             "jct_median": {p: med(main_rows, p, 1) for p in main_rows[0] if not p.startswith("_")},
             "kappa_median": {k: float(np.median(v)) for k, v in kappa.items()},
             "lambda_median": {v: float(np.median(x)) for v, x in lam.items()},
             "servers_median": {n: {p: med(servers[n], p) for p in NAMES} for n in SERVERS}}
    (out / "contention.json").write_text(json.dumps(table, indent=1))
    print(json.dumps({"faithful": is_faithful, "seeds": len(seeds), **head,
                      "bco_over_lb": round(float(np.median(lb)), 4), "opt_gap_p95": gap["p95"],
                      "opt_proved": f"{gap['proved']}/{gap['tried']}", "ls_sjf_optimal": gap["ls_sjf_optimal"],
                      "bco_arrival_over_ls": round(float(np.median(arr)), 4),
                      "start_wait": {k: wait[k] for k in ("ratio_ls", "ratio_ls_sjf", "ratio_ff", "ratio_rand")},
                      "calibrated" if is_faithful else "faithful_generator":
                          {k: cal[k] for k in ("order_frac", "ratio_ls", "ratio_ls_sjf", "ratio_ff", "ratio_rand")},
                      "pays": pay}))


if __name__ == "__main__":
    main()
