"""Efficiency of parsl-bft's planners on a real log, measured like the BFTrainer paper.

theta_2022 (recorded schedule, outages masked), ImageNet 7-model mix:
  A. a 256-node slice, 24 h: planners milp, dp, equal-share, greedy x objectives throughput, speedup
  B. the same slice: T_fwd 10 / 60 / 300 s, horizon awareness off / on (dp, speedup)
  C. the full machine (4,360 nodes), one week, 100 jobs at once: dp vs equal-share (speedup); the PuLP MILP
     reaches the same optimum but costs 0.3-0.8 s per solve at 100 jobs x 4,360 nodes (DP: ~10 ms)
  D. network topology: the 256-node Summit slice (eval/summit_256n_24h_idle_intervals.csv.gz, racks from the
     hostnames), 24 h, dp/speedup; the rate model charges communication (SJF-BCO eqs. 6-8 per rack) in every
     row; placements oblivious (today's), compact and sjf-bco, the last also with topology-blind sizes
  E. hole ends: the Summit slice, 24 h, dp/speedup, side by side: BFTrainer's published replayer figures (from
     docs, not re-run), equal-share, horizon-blind (T_fwd 10 and 60 s), horizon-aware with the online
     hole-history predictor (past only), clairvoyant (the real ends: an upper bound), and each run's ceiling
     (the same replay with free rescales and reclaims); losses as shares of the idle node-seconds; each row also
     under this runtime's measured costs (parsl_bft/data/runtime.costs.csv, --costs measured), and the best of
     those with no reclaim announced; then theta_2022 replayed FCFS+EASY (the slice of A),
     horizon-aware with the EASY reservations from requested walltimes (what the scheduler knows); and
     8 single days of the full Summit log (first 256 nodes): blind vs aware vs clairvoyant, one mean each
  F. held-out logs (--only-held-out: the traces other than theta_2022, 256 nodes, 24 h and 7 day windows from
     day 10 and day 40, --submits relative): equal-share vs dp at T_fwd 10 s and 60 s, and the ceiling
Ratios are against equal-share in the same invocation. LAST line: one JSON object (with section E:
{"e_idle": best realistic, "e_used", "ceiling_e_idle", "equal_share_e_idle", "clairvoyant_e_idle",
"e_idle_measured", "ceiling_e_idle_measured", "results"}; e_idle is under BFTrainer's costs).
--submits relative counts the job set's submit times from each replayed window's start (for a log of another
era than the job set; the default, absolute, takes them as written, and a replay no job can enter is an error).
Usage: python benchmarks/efficiency.py [--data ../shared/data] [--quick] [--only-topology] [--only-horizon]
                                       [--only-held-out] [--submits absolute|relative]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from parsl_bft.errors import InputError
from parsl_bft.idle.sources import load_source, mask_outages
from parsl_bft.jobs import JobSet, load_jobset
from parsl_bft.planner import Planner
from parsl_bft.planner.netcost import NetworkCost
from parsl_bft.planner.topo_placement import make_placement
from parsl_bft.sim import simulate
from parsl_bft.sim.costs import BFTRAINER, MEASURED, CostModel, cost_model
from parsl_bft.topology import load_topology

START = 100 * 86400      # 100 days into 2022: a stretch with few outages
SUBMITS = {"submits": "absolute"}    # --submits, for every replay of this invocation


def run(iv, js, label, max_concurrent=10, duration=86400, **kw):
    t = time.perf_counter()
    m = simulate(iv, js, Planner(**kw), max_concurrent=max_concurrent, duration=duration, **SUBMITS).metrics()
    m.update(label=label, wall_s=time.perf_counter() - t, **{k: v for k, v in kw.items()})
    print(f"{label:44} e_idle {m['e_idle']:.3f}  e_used {m['e_used']:.3f}  util {m['util']:.3f}  "
          f"rescale {m['rescale_loss'] / 1e6:8.1f}M  reclaim {m['reclaim_loss'] / 1e6:8.1f}M  "
          f"fin {m['jobs_finished']:3d}  solve p50 {m['solve_p50_s'] * 1e3:6.1f} ms "
          f"p99 {m['solve_p99_s'] * 1e3:6.1f} ms"
          f"  ({m['wall_s']:.1f} s)")
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--quick", action="store_true", help="6 h slice, no full-machine week")
    ap.add_argument("--only-topology", action="store_true", help="section D only")
    ap.add_argument("--only-horizon", action="store_true", help="section E only")
    ap.add_argument("--only-held-out", action="store_true", help="section F only")
    ap.add_argument("--submits", choices=["absolute", "relative"], default="absolute",
                    help="job submit times as written or counted from each replayed window's start")
    args = ap.parse_args()
    SUBMITS["submits"] = args.submits
    data = Path(args.data)
    js = load_jobset(data / "jobs" / "imagenet_mix.jobs.csv")
    results = []
    day = 6 * 3600 if args.quick else 86400
    if args.only_topology:
        topology_section(data, js, day, results)
        _report(results)
        return
    if args.only_horizon:
        _report(results, horizon_section(data, js, day, results))
        return
    if args.only_held_out:
        _report(results, held_out_section(data, js, results))
        return
    src = load_source(data / "traces" / "theta_2022.swf.gz")
    masked = mask_outages(src.intervals)
    t0 = masked.t0 + START
    slice_ = masked.first_nodes(256).window(t0, t0 + day)
    print(f"A. 256 nodes x {day / 3600:.0f} h of theta_2022 (masked), max 10 jobs, T_fwd 10 s")
    for obj in ("throughput", "speedup"):
        for method in ("milp", "dp", "equal-share", "greedy"):
            results.append(run(slice_, js, f"  {method:12} {obj}", duration=day, method=method, objective=obj))
    base = next(r for r in results if r["method"] == "equal-share" and r["objective"] == "speedup")
    best = next(r for r in results if r["method"] == "milp" and r["objective"] == "speedup")
    print(f"  -> milp/speedup vs equal-share: e_idle x{best['e_idle'] / base['e_idle']:.3f}, "
          f"rescale loss x{best['rescale_loss'] / max(base['rescale_loss'], 1):.3f}")
    print("B. T_fwd and horizon awareness (dp, speedup)")
    for tf in (10, 60, 300):
        for h in (False, True):
            results.append(run(slice_, js, f"  T_fwd {tf:4d} s horizon {'on ' if h else 'off'}", duration=day,
                               method="dp", objective="speedup", t_fwd=tf, horizon_aware=h))
    if not args.quick:
        week = masked.window(t0, t0 + 7 * 86400)
        print(f"C. full machine ({week.n_nodes} nodes), 7 days, max 100 jobs")
        for method in ("dp", "equal-share"):
            results.append(run(week, js, f"  {method:12} speedup", max_concurrent=100, duration=7 * 86400,
                               method=method, objective="speedup"))
    topology_section(data, js, day, results)
    _report(results, horizon_section(data, js, day, results))


HELD_OUT = ("NASA-iPSC-1993-3.1-cln.swf.gz", "lublin_256.swf.gz", "metacentrum_wagap_2013.swf.gz",
            "RICC-2010-2.swf.gz")


def held_out_section(data: Path, js, results: list) -> dict:
    """F. the logs of ../shared/data/traces other than theta_2022: the first 256 nodes (outages masked), windows
    of 24 h and 7 days starting 10 and 40 days in (jobs from each window's start), equal-share vs dp at T_fwd
    10 s (BFTrainer's) and 60 s (simulate's default), with the default's ceiling."""
    print("F. held-out logs: 256 nodes, 24 h and 7 d windows from day 10 and day 40, speedup, max 10 jobs, "
          "--submits relative")
    worst = np.inf
    for log in HELD_OUT:
        try:
            src, how = load_source(data / "traces" / log), "recorded"
        except InputError:          # no waits recorded, or starts over capacity: the EASY replay of its jobs
            src, how = load_source(data / "traces" / log, schedule="easy"), "easy"
        m = mask_outages(src.intervals).first_nodes(256)
        for offset, days in ((10, 1), (10, 7), (40, 1), (40, 7)):
            t0 = m.t0 + offset * 86400
            w = m.window(t0, t0 + days * 86400)
            if not len(w.start):
                print(f"  {log} ({how}) day {offset} +{days}d: no idle capacity")
                continue
            row = {}
            for label, kw, ceil in (("equal-share", dict(method="equal-share"), False),
                                    ("dp T_fwd 10", dict(method="dp", t_fwd=10), False),
                                    ("dp T_fwd 60", dict(method="dp", t_fwd=60), True)):
                r = simulate(w, js, Planner(objective="speedup", **kw), duration=days * 86400, submits="relative",
                             ceiling=ceil).metrics()
                r.update(label=f"held-out {log} day {offset} +{days}d {label}", method=kw["method"],
                         objective="speedup")
                results.append(r)
                row[label] = r
            d = row["dp T_fwd 60"]
            worst = min(worst, d["e_idle"] - row["equal-share"]["e_idle"])
            print(f"  {log[:24]:24} ({how:8}) day {offset:2} +{days}d  {w.n_nodes:3} nodes  e_idle: equal-share "
                  f"{row['equal-share']['e_idle']:.4f}  dp 10 s {row['dp T_fwd 10']['e_idle']:.4f}  dp 60 s "
                  f"{d['e_idle']:.4f} (util {d['util']:.4f})  ceiling {d['ceiling_e_idle']:.4f}  "
                  f"dp 60 s / ceiling {d['e_idle'] / d['ceiling_e_idle']:.3f}")
    print(f"  -> dp (T_fwd 60 s) minus equal-share, worst window: {worst:+.4f} e_idle")
    return {"held_out_worst_margin": worst}


BFTRAINER_E = {"e_idle": 0.898, "e_used": 0.931}   # its replayer, CBC, T_fwd 10 s, same slice (shared notes)


def no_notice(model: CostModel) -> CostModel:
    """``model`` with no reclaim announced (a bound on what notice is worth)."""
    return CostModel(f"{model.name}, no notice", {k: dataclasses.replace(r, notice={c: 0.0 for c in r.notice})
                                                  for k, r in model.rows.items()})


def horizon_section(data: Path, js, day: float, results: list) -> dict:
    summit = load_source(data / "eval" / "summit_256n_24h_idle_intervals.csv.gz").intervals
    print(f"E. hole ends ({BFTRAINER} costs unless named): Summit slice ({summit.n_nodes} nodes), "
          f"{day / 3600:.0f} h, speedup, max 10 jobs; ceiling = "
          "same replay, free rescales and reclaims")
    print(f"  {'BFTrainer replayer (published)':44} e_idle {BFTRAINER_E['e_idle']:.3f}  "
          f"e_used {BFTRAINER_E['e_used']:.3f}")
    measured = cost_model(MEASURED)
    assert measured is not None
    print(f"  cost models side by side: {BFTRAINER} (the job set's t_up / t_down) and {MEASURED} ({measured.name}: "
          "this runtime's restarts, saves ahead of announced reclaims; ceilings are the same free replay)")
    rows = horizon_rows(summit, None, js, day, results, "horizon", (
            ("equal-share", "history", dict(method="equal-share")),
            ("blind T_fwd 10", "none", dict(method="dp", t_fwd=10)),
            ("blind T_fwd 60", "none", dict(method="dp", t_fwd=60)),
            ("aware history T_fwd 10", "history", dict(method="dp", t_fwd=10, horizon_aware=True)),
            ("aware history T_fwd 60", "history", dict(method="dp", t_fwd=60, horizon_aware=True)),
            ("clairvoyant T_fwd 10 (bound)", "clairvoyant", dict(method="dp", t_fwd=10, horizon_aware=True)),
            ("clairvoyant T_fwd 60 (bound)", "clairvoyant", dict(method="dp", t_fwd=60, horizon_aware=True))),
        measured)
    realistic = [m for k, m in rows.items() if "clairvoyant" not in k and k != "equal-share"]
    best = max(realistic, key=lambda m: m["e_idle"])
    clair = max((m for k, m in rows.items() if "clairvoyant" in k), key=lambda m: m["e_idle"])
    print(f"  -> best realistic: {best['label']}; vs BFTrainer e_idle x{best['e_idle'] / BFTRAINER_E['e_idle']:.3f}")
    best_m = max(realistic, key=lambda m: m["e_idle_measured"])
    print(f"  -> under {MEASURED} costs ({measured.name}): best realistic {best_m['label']}: e_idle "
          f"{best_m['e_idle_measured']:.3f}, ceiling {best_m['ceiling_e_idle']:.3f}, e_idle/ceiling "
          f"{best_m['e_idle_measured'] / best_m['ceiling_e_idle']:.3f}")
    silent = no_notice(measured)
    kw = {k: best_m[k] for k in ("method", "t_fwd", "horizon_aware")}
    e_silent = simulate(summit, js, Planner(objective="speedup", **kw), duration=day, predict=best_m["predict"],
                        costs=silent, **SUBMITS).metrics()["e_idle"]
    print(f"  -> the same with no reclaim announced (every notice share 0: work since the last periodic save "
          f"lost): e_idle {e_silent:.3f}")
    print(f"  -> nodes that joined together and left together: {_left_together(summit):.0%} of such pairs; "
          f"{len(summit.start) / len(np.unique(summit.start)):.1f} nodes join per event")
    # every used hole ends in a reclaim that pauses its job t_down (at ~1 node-s per node and second: speedups
    # are near-linear at these sizes) whatever the planner knows: what is left for planning is above this floor
    floor = len(summit.start) * min(j.t_down for j in js.jobs) / best["idle_node_s"]
    print(f"  -> reclaim floor ~{floor:.3f} ({len(summit.start)} holes x min t_down): at most ~"
          f"{best['ceiling_e_idle'] - floor:.3f} e_idle (an estimate) for any planner that uses every hole")
    free_growth = JobSet([dataclasses.replace(j, t_up=0.0) for j in js.jobs], js.curves)
    grow = {p: simulate(summit, free_growth, Planner(objective="speedup", method="dp", t_fwd=60, horizon_aware=True),
                        duration=day, predict=p, **SUBMITS).metrics()["e_idle"] for p in ("history", "clairvoyant")}
    print(f"  -> growing for free (t_up = 0; reclaims and shrinks still cost), aware T_fwd 60: history "
          f"{grow['history']:.3f}, clairvoyant {grow['clairvoyant']:.3f}")
    days = other_days(data, js, results)
    src = load_source(data / "traces" / "theta_2022.swf.gz", schedule="easy")
    masked = mask_outages(src.intervals)
    t0 = masked.t0 + START
    theta = masked.first_nodes(256).window(t0, t0 + day)
    print(f"  theta_2022, FCFS+EASY replay (--swf --schedule easy), {theta.n_nodes} nodes (masked), same window as A")
    easy = horizon_rows(theta, src.schedule, js, day, results, "theta easy", (
            ("equal-share", "history", dict(method="equal-share")),
            ("blind T_fwd 60", "none", dict(method="dp", t_fwd=60)),
            ("aware easy T_fwd 60", "easy", dict(method="dp", t_fwd=60, horizon_aware=True)),
            ("aware history T_fwd 60", "history", dict(method="dp", t_fwd=60, horizon_aware=True)),
            ("clairvoyant T_fwd 60 (bound)", "clairvoyant", dict(method="dp", t_fwd=60, horizon_aware=True))))
    return {"e_idle": best["e_idle"], "e_used": best["e_used"], "ceiling_e_idle": best["ceiling_e_idle"],
            "equal_share_e_idle": rows["equal-share"]["e_idle"], "clairvoyant_e_idle": clair["e_idle"],
            "best": best["label"], "bftrainer": BFTRAINER_E,
            "e_idle_measured": best_m["e_idle_measured"], "ceiling_e_idle_measured": best_m["ceiling_e_idle"],
            "best_measured": best_m["label"], "cost_model_measured": measured.name,
            "e_idle_measured_no_notice": e_silent, "reclaim_floor": floor, "free_growth_e_idle": grow,
            "theta_easy_e_idle": {k: round(m["e_idle"], 4) for k, m in easy.items()},
            "theta_easy_ceiling_e_idle": easy["blind T_fwd 60"]["ceiling_e_idle"], "summit_8_days_mean_e_idle": days}


def other_days(data: Path, js, results: list, n: int = 8) -> dict:
    """One slice can mislead (a plan that differs once sends a replay down another path): the first 256 nodes of
    the full Summit log, each of its first ``n`` days, blind vs aware (history) vs clairvoyant, T_fwd 60 s."""
    full = load_source(data / "eval" / "summit_2021feb_idle_intervals.csv.gz").intervals.first_nodes(256)
    runs = {"blind": ("none", False), "aware history": ("history", True), "clairvoyant (bound)": ("clairvoyant", True)}
    e = {k: [] for k in runs}
    for d in range(n):
        w = full.window(full.t0 + d * 86400, full.t0 + (d + 1) * 86400)
        for k, (predict, aware) in runs.items():
            m = simulate(w, js, Planner(method="dp", objective="speedup", t_fwd=60, horizon_aware=aware),
                         duration=86400, predict=predict, submits="relative").metrics()
            e[k].append(m["e_idle"])
            results.append({**m, "label": f"summit day {d} {k}", "method": "dp", "objective": "speedup"})
    print(f"  Summit log, first 256 nodes, days 0-{n - 1} (jobs from each day's start), T_fwd 60 s, e_idle per day:")
    for k, v in e.items():
        print(f"  {k:44} " + " ".join(f"{x:.3f}" for x in v) + f"  mean {np.mean(v):.4f}")
    return {k: float(np.mean(v)) for k, v in e.items()}


def horizon_rows(iv, schedule, js, day: float, results: list, prefix: str, variants, measured=None) -> dict:
    """One replay (with its ceiling) per (label, predictor, planner settings); prints each with its losses; with
    ``measured`` (a CostModel) also the same replay under it (its ceiling: the same free replay)."""
    rows = {}
    for label, predict, kw in variants:
        t = time.perf_counter()
        res = simulate(iv, js, Planner(objective="speedup", **kw), duration=day, predict=predict, schedule=schedule,
                       ceiling=True, **SUBMITS)
        m = res.metrics()
        for loss in ("rescale", "reclaim"):      # in 1-node seconds, as a share of the idle node-seconds
            m[f"{loss}_share"] = sum(getattr(a, f"{loss}_loss") / a.state.curve.rate(1)
                                     for a in res.jobs) / m["idle_node_s"]
        m.update(label=f"{prefix} {label}", method=kw["method"], objective="speedup", predict=predict,
                 wall_s=time.perf_counter() - t, t_fwd=kw.get("t_fwd", 10), horizon_aware=kw.get("horizon_aware",
                                                                                                 False))
        if measured is not None:
            mm = simulate(iv, js, Planner(objective="speedup", **kw), duration=day, predict=predict,
                          schedule=schedule, costs=measured, **SUBMITS).metrics()
            m["e_idle_measured"] = mm["e_idle"]
        rows[label] = m
        results.append(m)
        print(f"  {label:44} e_idle {m['e_idle']:.3f}  e_used {m['e_used']:.3f}  ceiling {m['ceiling_e_idle']:.3f}  "
              f"e_idle/ceiling {m['e_idle'] / m['ceiling_e_idle']:.3f}  rescale {m['rescale_share']:.4f}  "
              f"reclaim {m['reclaim_share']:.4f}  ({m['wall_s']:.1f} s)"
              + (f"  | {MEASURED}: e_idle {m['e_idle_measured']:.3f}  e_idle/ceiling "
                 f"{m['e_idle_measured'] / m['ceiling_e_idle']:.3f}" if measured is not None else ""))
    return rows


def _left_together(iv) -> float:
    """Of the pairs of holes that began at one instant, the share that also ended at one instant."""
    pairs = together = 0
    for t in np.unique(iv.start):
        _, n = np.unique(iv.end[iv.start == t], return_counts=True)
        pairs += n.sum() * (n.sum() - 1) // 2
        together += int((n * (n - 1) // 2).sum())
    return together / pairs if pairs else 0.0


def topology_section(data: Path, js, day: float, results: list) -> None:
    summit = load_source(data / "eval" / "summit_256n_24h_idle_intervals.csv.gz").intervals
    topo = load_topology("hostname-rack")
    net = NetworkCost(topo)
    racks = topo.span(summit.names)
    print(f"D. Summit slice ({summit.n_nodes} nodes in {racks} racks), {day / 3600:.0f} h, dp/speedup, rate model "
          "charges communication per rack (NetworkCost defaults)")
    rows = {}
    for label, placement, values in (("oblivious", "oblivious", False), ("compact", "compact", True),
                                     ("sjf-bco", "sjf-bco", True), ("sjf-bco, blind sizes", "sjf-bco", False)):
        t = time.perf_counter()
        planner = Planner(method="dp", objective="speedup", placement=make_placement(placement, topo),
                          network=net if values else None)
        m = simulate(summit, js, planner, duration=day, network=net, **SUBMITS).metrics()
        m.update(label=f"topology {label}", method="dp", objective="speedup", wall_s=time.perf_counter() - t)
        rows[label] = m
        results.append(m)
        print(f"  {label:22} e_idle {m['e_idle']:.3f}  e_used {m['e_used']:.3f}  util {m['util']:.3f}  "
              f"net factor {m['net_factor']:.3f}  fin {m['jobs_finished']:3d}  ({m['wall_s']:.1f} s)")
    base = rows["oblivious"]["e_idle"]
    print("  -> e_idle vs oblivious: " + ", ".join(f"{k} x{v['e_idle'] / base:.3f}" for k, v in rows.items()
                                                  if k != "oblivious"))


def _report(results: list, summary: dict | None = None) -> None:
    keys = ("label", "method", "objective", "e_idle", "e_used", "util", "rescale_loss", "reclaim_loss",
            "jobs_finished", "solve_p50_s", "solve_p99_s", "net_factor", "ceiling_e_idle")
    print(json.dumps({**(summary or {}), "results": [{k: r.get(k) for k in keys} for r in results]}))


if __name__ == "__main__":
    main()
