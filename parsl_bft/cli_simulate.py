"""``parsl-bft simulate``: its options and its handler (a replay of idle capacity with a job set)."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .csvio import check_output_path
from .errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from .idle.intervals import IdleIntervals
    from .idle.sources import IdleSource
    from .sim.replay import SimResult


def make_console() -> Console:
    """The console the commands print to (stdout)."""
    from rich.console import Console
    return Console(stderr=False)


def add_source_args(p: argparse.ArgumentParser) -> None:
    """The options that pick and slice an idle-capacity source (idle and simulate)."""
    p.add_argument("--schedule", choices=["recorded", "easy"], default="recorded",
                   help="SWF only: the logged starts, or an FCFS+EASY-backfill replay of the same jobs")
    p.add_argument("--units", choices=["auto", "nodes", "cores"], default="auto", help="SWF only: size units")
    p.add_argument("--swf-variant", choices=["auto", "standard", "walltime6"], default="auto",
                   help="SWF only: 'walltime6' = requested walltime in field 6 (ALCF/Mira logs)")
    p.add_argument("--window", help="START/END or START/+DURATION; START: unix s, ISO date or +OFFSET (e.g. +2d/+24h)")
    p.add_argument("--nodes", type=int, help="keep the first N distinct nodes (order of first appearance)")
    p.add_argument("--no-mask", action="store_true", help="do not mask outages (>= 90%% idle for >= 1 h)")
    p.add_argument("--lenient", action="store_true", help="skip bad rows (and say how many) instead of failing")


def load_selected(args: argparse.Namespace, progress: Callable[[int], object] | None = None
                  ) -> tuple[IdleSource, IdleIntervals, IdleIntervals]:
    """Load the source named by args and apply --window, --nodes and outage masking."""
    from .idle.sources import load_source, mask_outages, parse_window

    src = load_source(args.source, schedule=args.schedule, units=args.units, variant=args.swf_variant,
                      lenient=args.lenient, progress=progress)
    raw = src.intervals
    # outages are a property of the whole machine: find them before slicing nodes or time
    masked = raw if args.no_mask else mask_outages(raw)
    if args.nodes is not None:        # --nodes 0 is refused there, not taken for all nodes
        raw, masked = raw.first_nodes(args.nodes), masked.first_nodes(args.nodes)
    if args.window:
        a, b = parse_window(args.window, raw.t0)
        raw, masked = raw.window(a, b), masked.window(a, b)
    return src, raw, masked


def _refuse_unused_source_options(args: argparse.Namespace) -> None:
    """Options that the chosen source would ignore: a user who sets them expects an effect and would get none."""
    swf_only = {"--schedule": args.schedule != "recorded", "--units": args.units != "auto",
                "--swf-variant": args.swf_variant != "auto"}
    unused = []
    if args.cluster is not None:      # a dedicated cluster: no log to slice or mask, no node ever leaves
        unused = [k for k, v in {**swf_only, "--window": bool(args.window), "--nodes": args.nodes is not None,
                                 "--no-mask": args.no_mask,
                                 "--horizon-aware": args.horizon_aware,
                                 "--predict": args.predict != "history"}.items() if v]
        why = "--cluster N replays a dedicated cluster (size it with N, the length with --duration)"
    elif args.idle_intervals:
        unused = [k for k, v in swf_only.items() if v]
        why = "these apply to an SWF job log (--swf), not to an idle-interval CSV"
    if unused:
        raise UsageError(f"{', '.join(unused)}: not used here: {why}")


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay idle capacity and train a job set on it with the chosen planner; print the metrics."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .idle.sources import parse_duration
    from .jobs import load_jobset
    from .planner import Planner
    from .planner.netcost import NetworkCost
    from .planner.topo_placement import make_placement
    from .sim import simulate
    from .sim.costs import cost_model
    from .sim.report import plot_replay, print_summary
    from .topology import load_topology

    console = make_console()
    args.source = args.idle_intervals or args.swf
    _refuse_unused_source_options(args)
    check_output_path(args.json, "--json")
    check_output_path(args.plot, "--plot")
    duration = parse_duration(args.duration) if args.duration else None
    if duration is not None and not duration > 0:     # 0 replayed nothing and reported success
        raise UsageError(f"--duration {args.duration!r}: must be > 0")
    topo = load_topology(args.topology) if args.topology else None
    network = NetworkCost(topo) if topo is not None else None
    planner = Planner(method=args.planner, solver=args.solver, objective=args.objective, t_fwd=args.tfwd,
                      time_limit=args.time_limit, horizon_aware=args.horizon_aware,
                      placement=make_placement(args.placement, topo),
                      network=network if args.placement != "oblivious" else None)
    jobset = load_jobset(args.jobs, args.scaling, lenient=args.lenient)
    costs = cost_model(args.costs)
    if costs is not None:
        costs.check(jobset)             # before the long load, not after it
    if args.cluster is not None:    # a dedicated cluster: free from the first submit until every job is done
        from .idle.sources import IdleSource
        from .sim.philly import dedicated_cluster
        t0 = min(j.submit for j in jobset.jobs)
        masked = dedicated_cluster(args.cluster, t0, t0 + 365 * 86400.0)
        src = IdleSource(masked, None, masked.source)
    else:
        with console.status(f"reading {args.source} ..."):
            src, _, masked = load_selected(args)
    config = _config(args, src.description, masked.n_nodes, costs.name if costs is not None else args.costs)
    with Progress(TextColumn("replaying"), BarColumn(), TextColumn("{task.percentage:>5.1f}% of trace time"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("replay", total=1.0)
        res = simulate(masked, jobset, planner, max_concurrent=args.max_concurrent,
                       duration=duration,
                       progress=lambda f: bar.update(task, completed=f), config=config, network=network,
                       predict=args.predict, schedule=src.schedule, ceiling=not args.no_ceiling,
                       submits=args.submits, freeze=not args.no_freeze, until_done=bool(args.cluster),
                       costs=costs)
    print_summary(res, console, title=f"{args.planner}/{args.objective} on {src.description}")
    _warn_if_jobs_ran_out(res, len(jobset.jobs), bool(args.cluster))
    if args.json:
        Path(args.json).write_text(json.dumps(res.as_dict(), indent=1))
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_replay(res, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def _config(args: argparse.Namespace, source: str, nodes: int, costs: str) -> dict[str, object]:
    """What the replay ran with, for its JSON report."""
    return {"source": source, "jobs": str(args.jobs), "planner": args.planner, "solver": args.solver,
            "objective": args.objective, "tfwd": args.tfwd, "horizon_aware": args.horizon_aware,
            "max_concurrent": args.max_concurrent, "nodes": nodes, "window": args.window,
            "duration": args.duration, "masked": not args.no_mask, "topology": args.topology,
            "placement": args.placement, "predict": args.predict, "submits": args.submits, "costs": costs}


def _warn_if_jobs_ran_out(res: SimResult, n_jobs: int, cluster: bool) -> None:
    """A replay whose jobs all finished early counts the idle capacity after that as unused: its e_idle says how
    little work there was, not how well it was used. Say so (a dedicated cluster ends with its jobs)."""
    ends = [a.finished_at for a in res.jobs if a.finished_at is not None]
    span = res.end - res.start
    if cluster or len(ends) < n_jobs or not ends or span <= 0 or max(ends) > res.start + 0.9 * span:
        return
    share = (max(ends) - res.start) / span
    print(f"parsl-bft simulate: warning: all {n_jobs} jobs finished {share:.0%} into the replay; the idle capacity "
          "after that counts as unused (e_idle measures the job set's size there): add jobs, or shorten "
          "--duration", file=sys.stderr)


def add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``simulate`` subcommand: its source, job set, planner, cost and output options."""
    s = sub.add_parser("simulate", help="replay idle capacity from a log and train a job set on it (model)")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--idle-intervals", metavar="FILE", help="node,idle_start,idle_end CSV[.gz]")
    src.add_argument("--swf", metavar="FILE", help="SWF job log[.gz]")
    src.add_argument("--cluster", type=int, metavar="N", help="a dedicated cluster of N nodes instead of idle "
                     "capacity (free all the time; the replay ends when every job is done)")
    add_source_args(s)
    s.add_argument("--jobs", required=True, help="X.jobs.csv (X.scaling.csv beside it) or a YAML job set")
    s.add_argument("--scaling", help="X.scaling.csv if not beside the jobs file")
    from .planner import METHODS, OBJECTIVES
    from .planner.methods import SOLVERS
    s.add_argument("--planner", choices=[m for m in METHODS if m != "node-milp"], default="dp",
                   help="dp: the exact DP (default: the same optimum as milp, tens of times faster); milp: the "
                   "MILP (PuLP; --solver); equal-share, greedy: baselines")
    s.add_argument("--solver", choices=list(SOLVERS), default="highs", help="MILP solver")
    s.add_argument("--objective", choices=list(OBJECTIVES), default="speedup", help="what the planner maximises "
                   "(the docs' explanation of the method says what each values)")
    s.add_argument("--tfwd", type=float, default=60.0, help="planning look-ahead T_fwd in seconds (default 60: "
                   "a resize must pay back its restart within it; BFTrainer's 10 s is shorter than a restart, so "
                   "running jobs hardly ever grow and joining nodes stay idle)")
    s.add_argument("--time-limit", type=float, default=10.0, help="MILP time limit per solve, seconds")
    s.add_argument("--horizon-aware", action="store_true",
                   help="value nodes by their predicted remaining idle time (see --predict)")
    s.add_argument("--predict", choices=["history", "easy", "clairvoyant", "none"], default="history",
                   help="what the planner knows of when idle nodes leave: past hole lengths (default), the EASY "
                   "reservations from requested walltimes (--swf with --schedule easy), nothing, or the real "
                   "ends (clairvoyant: an upper bound, not a realistic result)")
    s.add_argument("--no-ceiling", action="store_true",
                   help="skip the second replay with free rescales and reclaims (ceiling_e_idle, the limit)")
    s.add_argument("--costs", default="bftrainer", metavar="MODEL",
                   help="what resizes and reclaims cost: bftrainer (the job set's t_up / t_down, every reclaim "
                   "pauses t_down; default), measured (this runtime's, parsl_bft/data/runtime.costs.csv) or a "
                   "costs file, *.costs.csv (restarts, saves ahead of announced reclaims, work lost since the last "
                   "periodic save to the others)")
    s.add_argument("--max-concurrent", type=int, default=10, help="jobs admitted at once (FCFS by submit)")
    s.add_argument("--no-freeze", action="store_true", help="never freeze layers, whatever the jobs allow")
    s.add_argument("--submits", choices=["absolute", "relative"], default="absolute",
                   help="job submit times as written (absolute, unix s) or counted from the replayed window's start "
                        "(relative: the first job arrives then; for a job set written for another log)")
    s.add_argument("--topology", metavar="SPEC", help="network groups: hostname-rack, hostname:REGEX, or a file "
                   "(topology.conf / scontrol show topology, pbsnodes -a -F json, YAML topology section); the "
                   "rate model then charges communication (SJF-BCO eqs. 6-8 per group)")
    s.add_argument("--placement", choices=["oblivious", "compact", "sjf-bco"], default="oblivious",
                   help="which nodes a job gets: topology-blind (default), fewest groups, or SJF-BCO's rule; "
                   "compact and sjf-bco also value sizes by their predicted slowdown and need --topology")
    s.add_argument("--duration", help="replay length from the first event, e.g. 24h (default: to the end)")
    s.add_argument("--json", help="write metrics, per-model and per-job rows to this JSON file")
    s.add_argument("--plot", help="write idle nodes and allocations over time to this PNG")
    s.set_defaults(func=cmd_simulate)
