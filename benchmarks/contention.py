"""Reproduce SJF-BCO's evaluation (Yu et al., MobiHoc 2022, section 7) in the paper's slotted offline setting.

A. 160 jobs (80 x 1, 14 x 2, 26 x 4, 30 x 8, 8 x 16, 2 x 32 GPUs) on 20 servers of 4/8/16/32 GPUs, per seed:
   makespan and average JCT of SJF-BCO, List-Scheduling, First-Fit, Random (and First-Fit with overtaking,
   Random read as random servers);
B. kappa sweep (1, 2, 4, 8, 10, 16, 32): SJF-BCO with kappa fixed;
C. lambda sweep (1, 2, 4, 8) with kappa = 1, and how many servers a multi-GPU job spans;
D. 10 / 15 / 20 servers (horizon 1500);
E. optimality gap: SJF-BCO / exact MILP optimum on small instances (2-3 servers of 2/4 GPUs, 4-5 jobs).
Plots go to out/contention/. LAST line: one JSON object (see the issue).
Usage: python benchmarks/contention.py [--seeds 30] [--small 50] [--out out/contention] [--quick] [--max-extra 0.15]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from parsl_bft.planner.contention import POLICIES, paper_instance, run, sjf_bco
from parsl_bft.planner.contention.milp import solve_optimal

ORDER = ("sjf-bco", "ls", "ff", "rand")
EXTRA = ("ff-bf", "rand-srv")      # other readings of the baselines, reported beside
KAPPAS = (1, 2, 4, 8, 10, 16, 32)
LAMBDAS = (1, 2, 4, 8)
SERVERS = (10, 15, 20)
PAPER = {"sjf-bco": 533, "ls": 594, "ff": 718, "rand": 1127}


def policies(inst, seed, horizon):
    t = time.perf_counter()
    b = sjf_bco(inst, horizon=horizon)
    out = {"sjf-bco": (b.outcome.makespan, b.outcome.mean_jct), "_bco_s": time.perf_counter() - t,
           "_kappa": b.kappa}
    for name, f in POLICIES.items():
        o = run(inst, f(inst, seed))
        out[name] = (o.makespan, o.mean_jct)
    return out


def small_instance(seed):
    rng = np.random.default_rng(10_000 + seed)
    n_servers = int(rng.integers(2, 4))
    mix = {1: int(rng.integers(1, 3)), 2: int(rng.integers(1, 3)), 4: 1}
    return paper_instance(10_000 + seed, servers=n_servers, mix=mix, iters=(3, 10), tau=(0.2, 0.5),
                          server_choices=(2, 4))


def plots(out: Path, main, kappa, lam, servers, gaps) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, k, label in ((axes[0], 0, "makespan (slots)"), (axes[1], 1, "average JCT (slots)")):
        vals = [[r[p][k] for r in main] for p in ORDER]
        ax.bar(ORDER, [np.median(v) for v in vals], yerr=[np.std(v) for v in vals], color="C0", alpha=0.8,
               label="this reproduction (median, std)")
        if k == 0:
            ax.plot(ORDER, [PAPER[p] for p in ORDER], "k^", label="paper (read off its plots)")
            ax.legend(fontsize=7)
        ax.set_ylabel(label)
    fig.suptitle(f"160 jobs, 20 servers, {len(main)} seeds")
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
    for p in ORDER:
        axes[2].plot([str(s) for s in SERVERS], [np.median([r[p][0] for r in servers[s]]) for s in SERVERS], "o-",
                     label=p)
    axes[2].set_xlabel("servers")
    for ax in axes:
        ax.set_ylabel("median makespan (slots)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sweeps.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.hist(gaps, bins=20)
    ax.set_xlabel("SJF-BCO / optimal makespan")
    ax.set_ylabel("instances")
    fig.tight_layout()
    fig.savefig(out / "optimality_gap.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--small", type=int, default=50, help="small instances for the optimality gap")
    ap.add_argument("--out", default="out/contention")
    ap.add_argument("--quick", action="store_true", help="5 seeds, 10 small instances")
    ap.add_argument("--max-extra", type=float, default=0.15, help="what contention and overhead add at most to a "
                    "job's time, split over 2 servers with 4 contending jobs (the paper: 15%%)")
    args = ap.parse_args()

    def paper(seed: int, servers: int):
        return paper_instance(seed, servers, max_extra=args.max_extra)
    seeds = range(5 if args.quick else args.seeds)
    n_small = 10 if args.quick else args.small
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(f"A. 160 jobs, 20 servers, {len(seeds)} seeds (horizon 1200; communication adds <= {args.max_extra:.0%})")
    main_rows = [policies(paper(s, 20), s, 1200) for s in seeds]
    for p in ORDER + EXTRA:
        mk = [r[p][0] for r in main_rows]
        jct = [r[p][1] for r in main_rows]
        print(f"  {p:8} makespan median {np.median(mk):7.1f} (p10 {np.percentile(mk, 10):6.0f}, p90 "
              f"{np.percentile(mk, 90):6.0f})  avg JCT median {np.median(jct):6.1f}  paper ~{PAPER.get(p, '-')}")
    order_ok = [r["sjf-bco"][0] < r["ls"][0] < r["ff"][0] < r["rand"][0] for r in main_rows]
    ratio = {p: float(np.median([r[p][0] / r["sjf-bco"][0] for r in main_rows])) for p in ORDER[1:] + EXTRA}
    print(f"  order SJF-BCO < LS < FF < RAND in {sum(order_ok)}/{len(order_ok)} seeds; median ratios "
          + ", ".join(f"{p}/bco {v:.3f}" for p, v in ratio.items()))
    bco_s = [r["_bco_s"] for r in main_rows]
    print(f"  SJF-BCO time per instance: median {np.median(bco_s):.2f} s, max {max(bco_s):.2f} s; kappa chosen: "
          f"{sorted(set(r['_kappa'] for r in main_rows))}")

    print("B. kappa sweep (kappa fixed)")
    kappa = {}
    for k in KAPPAS:
        kappa[k] = [sjf_bco(paper(s, 20), kappas=[k]).outcome.makespan for s in seeds]
        print(f"  kappa {k:2d}: median makespan {np.median(kappa[k]):7.1f}")
    kappa_best = min(KAPPAS, key=lambda k: (np.median(kappa[k]), k))

    print("C. lambda sweep (kappa = 1)")
    lam = {}
    for v in LAMBDAS:
        lam[v], spans = [], []
        for s in seeds:
            inst = paper(s, 20)
            b = sjf_bco(inst, kappas=[1], lam=float(v))
            lam[v].append(b.outcome.makespan)
            spans += [len(np.unique(inst.server_of[g])) for j, g in enumerate(b.schedule.gpus) if inst.gpus[j] > 1]
        print(f"  lambda {v}: median makespan {np.median(lam[v]):7.1f}; servers per multi-GPU job "
              f"{np.mean(spans):.2f}")
    lam_med = [np.median(lam[v]) for v in LAMBDAS]
    lambda_monotone = bool(all(b <= a for a, b in zip(lam_med, lam_med[1:])))

    print("D. servers (horizon 1500)")
    servers = {20: main_rows}
    for n in SERVERS:
        if n != 20:
            servers[n] = [policies(paper(s, n), s, 1500) for s in seeds]
        meds = {p: np.median([r[p][0] for r in servers[n]]) for p in ORDER + EXTRA}
        print(f"  {n:2d} servers: " + "  ".join(f"{p} {v:7.1f}" for p, v in meds.items())
              + "   /SJF-BCO: " + ", ".join(f"{p} {meds[p] / meds['sjf-bco']:.3f}" for p in ("ls", "rand", "rand-srv")))

    print(f"E. optimality gap on {n_small} small instances (exact MILP)")
    gaps, t0 = [], time.perf_counter()
    for s in range(n_small):
        inst = small_instance(s)
        b = sjf_bco(inst, horizon=200).outcome.makespan
        opt = solve_optimal(inst, b).makespan
        gaps.append(b / opt)
    print(f"  SJF-BCO / optimal: median {np.median(gaps):.3f}, p95 {np.percentile(gaps, 95):.3f}, max "
          f"{max(gaps):.3f}; optimal in {sum(g == 1.0 for g in gaps)}/{len(gaps)} ({time.perf_counter() - t0:.1f} s)")

    inst = paper(0, 20)
    t = time.perf_counter()
    sjf_bco(inst)
    runtime_s = time.perf_counter() - t
    plots(out, main_rows, kappa, lam, servers, gaps)
    print(f"plots: {out / 'policies.png'}, {out / 'sweeps.png'}, {out / 'optimality_gap.png'}")
    table = {"makespan_median": {p: float(np.median([r[p][0] for r in main_rows])) for p in ORDER + EXTRA},
             "jct_median": {p: float(np.median([r[p][1] for r in main_rows])) for p in ORDER + EXTRA},
             "kappa_median": {k: float(np.median(v)) for k, v in kappa.items()},
             "lambda_median": {v: float(np.median(x)) for v, x in lam.items()},
             "servers_median": {n: {p: float(np.median([r[p][0] for r in servers[n]])) for p in ORDER}
                                for n in SERVERS}}
    (out / "contention.json").write_text(json.dumps(table, indent=1))
    print(json.dumps({"seeds": len(seeds), "order_frac": sum(order_ok) / len(order_ok),
                      "ratio_ls": round(ratio["ls"], 4), "ratio_ff": round(ratio["ff"], 4),
                      "ratio_rand": round(ratio["rand"], 4), "kappa_best": kappa_best,
                      "lambda_monotone": lambda_monotone, "opt_gap_p95": round(float(np.percentile(gaps, 95)), 4),
                      "runtime_s": round(runtime_s, 3)}))


if __name__ == "__main__":
    main()
