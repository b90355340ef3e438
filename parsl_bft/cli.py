"""The ``parsl-bft`` command."""
from __future__ import annotations

import argparse
import errno
import json
import sqlite3
import sys
import time
import warnings
from pathlib import Path
from typing import NoReturn

from .cli_simulate import add_source_args as _add_source_args
from .cli_simulate import load_selected
from .cli_simulate import make_console as _console
from .csvio import check_output_path
from .errors import ParslBftError, UsageError
from .extras import optional_imports


def cmd_idle(args: argparse.Namespace) -> int:
    """Idle-capacity statistics of a job log or idle-interval file, as a table (and JSON, a plot)."""
    from rich.table import Table

    from .idle.stats import idle_stats, plot_idle

    console = _console()
    check_output_path(args.json, "--json")
    check_output_path(args.plot, "--plot")
    with console.status(f"reading {args.source} ..."):
        src, raw, masked = load_selected(args)
        st = idle_stats(raw, masked, src.schedule)
    t = Table(title=src.description, show_header=False)
    t.add_row("nodes", f"{st.nodes}")
    t.add_row("span", f"{st.span_s / 86400:.2f} days, masked outages {st.masked_s / 86400:.2f} days "
                      f"({len(masked.masked or [])} periods)")
    t.add_row("idle fraction (raw)", f"{st.idle_fraction_raw:.2%}")
    t.add_row("idle fraction (outages masked)", f"{st.idle_fraction:.2%}")
    if st.idle_while_waiting is not None:
        t.add_row("idle while jobs wait", f"{st.idle_while_waiting:.2%} of node-time "
                                          f"(jobs wait {st.time_jobs_waiting:.1%} of the time)")
    t.add_row("hole duration p50/p90/p99", " / ".join(f"{v:,.0f} s" for v in st.hole_duration_s.values()))
    t.add_row("idle nodes at once p50/p90/p99", " / ".join(f"{v:,.0f}" for v in st.hole_width_nodes.values()))
    t.add_row("events per hour", f"{st.events_per_hour:,.1f}")
    console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps({"source": src.description, **st.as_dict(),
                                               "masked_periods": masked.masked}, indent=2))
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_idle(masked, args.plot, src.schedule, title=src.description)
        console.print(f"wrote {args.plot}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """Check a job set and summarise each model's measured scaling."""
    from rich.table import Table

    from .jobs import load_jobset

    js = load_jobset(args.jobs, args.scaling, lenient=args.lenient)
    t = Table(title=f"{len(js.jobs)} jobs, {len(js.curves)} models")
    for c in ("model", "jobs", "P(1) samples/s", "P(64)", "speedup@64", "serial fraction (Amdahl fit)"):
        t.add_column(c)
    for m, curve in sorted(js.curves.items()):
        t.add_row(m, str(sum(j.model == m for j in js.jobs)), f"{curve.rate(1):,.0f}", f"{curve.rate(64):,.0f}",
                  f"{curve.speedup(64):.1f}", f"{curve.serial_fraction:.4f}")
    _console().print(t)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The README's main command: training on an emulated idle pool of the local machine."""
    from .execution.demo import run_demo

    if not 0 < args.speedup < float("inf"):
        raise UsageError(f"--speedup must be a finite number > 0, got {args.speedup}")
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as e:                # before the long work, not a traceback after it
        raise UsageError(f"--out {args.out}: cannot make that folder: {e.strerror}") from None
    console = _console()
    console.rule("parsl-bft demo: 3 training jobs on the idle nodes of a (replayed) supercomputer")
    run_demo(args.out, speedup=args.speedup, console=console)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure a workload's samples/s on each rank count here, and its rescale costs."""
    from rich.progress import Progress
    from rich.table import Table

    from .train.profiler import measure_layer_shares, profile, rescale_costs, write_profile

    console = _console()
    check_output_path(args.out, "--out")
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        raise UsageError(f"--ranks {args.ranks!r}: expected comma-separated rank counts, e.g. 1,2,4") from None
    if not ranks or min(ranks) < 1 or max(ranks) > 1024:
        raise UsageError(f"--ranks {args.ranks!r}: rank counts must be between 1 and 1024")
    for opt, v in (("--steps", args.steps), ("--global-batch", args.global_batch)):
        if v < 1:                       # --steps 0 "measured" nothing and printed rates
            raise UsageError(f"{opt} must be >= 1, got {v}")
    if args.freeze_layers < 0:
        raise UsageError(f"--freeze-layers must be >= 0, got {args.freeze_layers}")
    from .train.workloads import workload_factory
    workload_factory(args.workload)     # an unknown one: here, not as a rank's traceback
    levels = _freeze_levels(args.freeze_levels)
    layers = measure_layer_shares(args.workload, args.global_batch) if levels or args.freeze_layers else None
    asked = (f"--freeze-levels {args.freeze_levels!r}", max(levels)) if levels else \
        (f"--freeze-layers {args.freeze_layers}", args.freeze_layers)
    if layers and asked[1] >= layers[0]:            # here, not as every rank's traceback after the launch
        raise UsageError(f"{asked[0]}: {args.workload} has {layers[0]} layers; levels go up to {layers[0] - 1} "
                         "(one must train)")
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"profiling {args.workload} on {args.ranks} ranks", total=len(ranks) * len(levels or [0]))
        pts = profile(args.workload, ranks, steps=args.steps, global_batch=args.global_batch,
                      freeze_layers=args.freeze_layers, freeze_levels=levels,
                      progress=lambda k: bar.update(task, completed=k))
    t = Table(title=f"{args.workload}: measured on this machine")
    for c in ("ranks", "frozen", "samples/s", "restore s", "rendezvous s", "checkpoint s", "launch overhead s"):
        t.add_column(c, justify="right")
    for p in pts:
        t.add_row(str(p.ranks), str(p.freeze), f"{p.samples_per_sec:,.1f}", f"{p.restore_s:.3f}",
                  f"{p.rendezvous_s:.3f}", f"{p.checkpoint_s:.3f}", f"{p.launch_s:.2f}")
    console.print(t)
    t_up, _t_down = rescale_costs(pts)
    console.print(f"rescale cost estimate: t_up = t_down = {t_up:.1f} s (use these in the jobs file)")
    if args.out:
        write_profile(args.out, args.model or args.workload, pts, layers)
        console.print(f"wrote {args.out}")
    if layers:
        from .planner.freeze import heldout_errors
        for _model, err in heldout_errors([(args.model or args.workload, p.ranks, p.samples_per_sec, p.freeze,
                                           layers[0], *layers[1][p.freeze]) for p in pts]).items():
            console.print(f"layer-aware throughput model: held-out error {err:.1%} (leave-one-out over the frozen "
                          "points)" if err is not None else "layer-aware throughput model: measure >= 2 frozen "
                          "points for a held-out error")
    return 0


def _freeze_levels(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        levels = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise UsageError(f"--freeze-levels {text!r}: expected comma-separated levels, e.g. 0,1,2") from None
    if levels[0] < 0:
        raise UsageError(f"--freeze-levels {text!r}: levels are >= 0")
    return sorted(set(levels) | {0})      # level 0 makes the curve the others are predicted from


def cmd_run(args: argparse.Namespace) -> int:
    """Run a scientist's workflow file (a Python script using parsl_bft's API) as __main__."""
    path = Path(args.workflow)
    if not path.exists():
        print(f"parsl-bft run: error: no such workflow file: {path}", file=sys.stderr)
        return 2
    if not path.is_file():
        raise UsageError(f"{path} is not a file: give the workflow's Python file")
    rest, paths = [], list(args.site or [])
    it = iter(args.args)
    for a in it:                      # --site may also follow the workflow (parsl-bft run W.py --site S.yaml)
        if a == "--site":
            paths.append(next(it, ""))
        elif a.startswith("--site="):
            paths.append(a.split("=", 1)[1])
        else:
            rest.append(a)
    if not all(paths):
        raise UsageError("--site needs a site file: parsl-bft run W.py --site SITE.yaml")
    from .sites import SiteError, load_site
    try:
        sites = [load_site(s) for s in paths]     # read once: the workflow's training_session gets these
    except SiteError as e:
        print(f"parsl-bft run: error: {e}", file=sys.stderr)
        return 2
    if sites:
        _console().print(f"sites: {', '.join(s.name for s in sites)}")
    from .execution.run import run_workflow
    run_workflow(path, sites, args=rest, new_run=args.new_run, progress=not args.quiet)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Per-job progress, nodes held and efficiency so far, from an orchestrator's state directory."""
    from .remote.commands import cmd_remote_status, wants_remote
    if wants_remote(args):              # a run id submitted through Globus Compute (parsl-bft submit)
        return cmd_remote_status(args)
    from rich.table import Table
    from rich.text import Text

    from .execution.events import RunEnd, Stop, parse_event
    from .execution.jobstore import JobStatus
    from .execution.report import STATUS_COLUMNS, printable, read_state, reference_note, status_json, status_row

    try:        # a read-only command: nothing is created or changed
        jobs, last = read_state(args.state, last_events=_event_count(args.events or "5"))
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(status_json(jobs, last), indent=1))
        return 0
    t = Table(title=Text(f"parsl-bft jobs in {printable(args.state)}"))
    for c in STATUS_COLUMNS:
        t.add_column(c, justify="right")
    for j in jobs:      # what the database says is text, never markup or control codes for the terminal
        t.add_row(*(Text(printable(c)) for c in status_row(j)))
    out = _console()
    out.print(t)
    out.print(Text(printable(reference_note(jobs))))
    for j in jobs:
        if j.row.status is JobStatus.FAILED:
            out.print(Text.assemble((f"{j.name} failed: ", "bold red"), printable(j.error or "")))
    full = args.events is not None      # asked for: each event whole, with its time
    for ts, kind, d in last:
        when = time.strftime("%H:%M:%S ", time.localtime(ts)) if full else ""
        detail = json.dumps(d)
        out.print(Text(printable(f"  {when}{kind:15} {detail if full else detail[:100]}")), soft_wrap=full)
    end = parse_event(last[-1][1], last[-1][2]) if last else None
    if isinstance(end, Stop) and RunEnd.of(end.why) is RunEnd.ERROR:
        out.print(Text.assemble(("the run stopped on an error: ", "bold red"), printable(str(end.why))))
    return 0


def _event_count(text: str) -> int | None:
    """--events N (the newest N) or all (None)."""
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise UsageError(f"--events is a number of events >= 0 or 'all', got {text!r}")
    return n


def cmd_sites(args: argparse.Namespace) -> int:
    """Validate site files (check: and ask their schedulers), print the Parsl Config one builds (show), or the
    field reference (schema)."""
    from .sites import SiteError, load_site

    if args.action == "schema":       # every field (docs/reference/site-file.md renders the same)
        from .site_schema import reference
        print(reference(), end="")
        return 0
    if args.action == "show":
        from .execution.site_runtime import show_config, show_pilot_script
        site = load_site(args.files[0])
        print(show_pilot_script(site) if args.pilot_script else show_config(site), end="")
        return 0
    bad = 0
    for f in args.files:
        try:
            site = load_site(f)
            note = f" ({len(site.unverified)} unverified: {', '.join(site.unverified)})" if site.unverified else ""
            kind = (f"remote site (Globus Compute endpoint {site.globus_compute_endpoint})"
                    if site.globus_compute_endpoint else f"{site.scheduler} site")
            if args.action == "check":      # live: the scheduler is asked (nothing is submitted)
                from .execution.site_runtime import SiteRuntime
                note = ": " + SiteRuntime.of(site).check_scheduler()
            print(f"{f}: ok, {kind} '{site.name}'{note}")
        except SiteError as e:
            print(f"parsl-bft sites: error: {_one_line(e)}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0          # a validator's verdict: 1 = some file is invalid


class _Parser(argparse.ArgumentParser):
    """argparse's, but a bad command line is one line, as every other user error is (``--help`` has the usage).
    Subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per ``cmd_*`` function."""
    p: argparse.ArgumentParser = _Parser(prog="parsl-bft",
                                         description="Train DNNs on the idle nodes of supercomputers.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error, not just its message")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_runtime_parsers(sub)

    i = sub.add_parser("idle", help="idle-capacity statistics and plot of an SWF log or idle-interval CSV")
    i.add_argument("source", help="*.swf[.gz] job log or node,idle_start,idle_end CSV[.gz]")
    _add_source_args(i)
    i.add_argument("--plot", help="write idle nodes over time to this PNG")
    i.add_argument("--json", help="write the statistics to this JSON file")
    i.set_defaults(func=cmd_idle)

    from .cli_simulate import add_simulate_parser
    add_simulate_parser(sub)
    from .cli_export import add_export_parser
    from .cli_metrics import add_metrics_parser
    add_metrics_parser(sub)
    add_export_parser(sub)

    pr = sub.add_parser("profile", help="measure a workload's samples/s on 1..k ranks and its rescale overheads")
    pr.add_argument("workload", help="images | lm | package.module:factory")
    pr.add_argument("--ranks", default="1,2", help="comma-separated rank counts (default 1,2)")
    pr.add_argument("--steps", type=int, default=20, help="training steps timed at each point")
    pr.add_argument("--global-batch", type=int, default=64, help="samples per step, over all ranks")
    pr.add_argument("--freeze-layers", type=int, default=0, help="measure with this many first layers frozen")
    pr.add_argument("--freeze-levels", help="measure with each of these numbers of layers frozen (e.g. 0,1,2) "
                    "and write the freeze columns the planner's layer elasticity reads")
    pr.add_argument("--model", help="model name to write in the CSV (default: the workload)")
    pr.add_argument("--out", help="write a *.scaling.csv here")
    pr.set_defaults(func=cmd_profile)

    j = sub.add_parser("jobs", help="check and summarise a job set (X.jobs.csv + X.scaling.csv, or YAML)")
    j.add_argument("jobs", help="X.jobs.csv (X.scaling.csv beside it) or a YAML job set")
    j.add_argument("--scaling", help="X.scaling.csv if not beside the jobs file")
    j.add_argument("--lenient", action="store_true", help="skip malformed rows (and say how many) instead of stopping")
    j.set_defaults(func=cmd_jobs)
    for sp in [*sub.choices.values(), *_subcommands(sub.choices["sites"])]:   # --debug also after the command
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def _subcommands(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [q for a in p._actions if isinstance(a, argparse._SubParsersAction) for q in a.choices.values()]


def _add_runtime_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """demo, run, status and sites, and the remote commands (submit, logs, cancel, fetch)."""
    d = sub.add_parser("demo", help="the main demo on the embedded default (the local machine)")
    d.add_argument("--out", default="out/demo", help="folder for plots and JSON")
    d.add_argument("--speedup", type=float, default=30.0, help="replay the trace this many times faster")
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("run", help="run a workflow file (Python, using parsl_bft's API)")
    r.add_argument("--site", action="append", help="site file (repeat for several sites; default: the embedded "
                   "default, this machine); the workflow's training_session() picks it up")
    r.add_argument("--new-run", action="store_true", help="start afresh: the workflow's old state directory is "
                   "kept aside (renamed), so jobs whose spec changed may keep their names")
    r.add_argument("--quiet", action="store_true", help="no live progress bars (on stderr)")
    r.add_argument("workflow", help="the workflow file (Python) to run")
    # argparse counts a REMAINDER positional as required and names it in the "required" error; it may be empty
    r.add_argument("args", nargs=argparse.REMAINDER, help="passed to the workflow as sys.argv[1:]").required = False
    r.set_defaults(func=cmd_run)

    st = sub.add_parser("status", help="per-job progress and nodes held, from an orchestrator's state directory")
    st.add_argument("state", nargs="?", default="bft-state", help="the state directory (default bft-state), or "
                    "the run id of a submitted run")
    from .remote.commands import add_parsers, add_site_arg
    st.add_argument("--events", metavar="N|all", help="show the newest N events of the run's event "
                    "log (default 5, cut to a line each), or all of them; each whole, with its time")
    st.add_argument("--json", action="store_true", help="print the jobs and the events as JSON instead of a table")
    add_site_arg(st)                    # status RUN_ID --site ENDPOINT.yaml: a remote run's status
    st.set_defaults(func=cmd_status)
    add_parsers(sub)                    # submit, logs, cancel, fetch: runs through Globus Compute

    si = sub.add_parser("sites", help="validate site files (check: and ask their scheduler), show the Parsl Config "
                        "one builds or its pilot script, or print the reference of every field (schema)")
    actions = si.add_subparsers(dest="action", required=True)
    actions.add_parser("validate", help="check site files (exit 1 if one is invalid)").add_argument(
        "files", nargs="+", metavar="FILE", help="site files (YAML)")
    show = actions.add_parser("show", help="print the Parsl Config a site file builds, as Python code")
    show.add_argument("files", nargs=1, metavar="FILE", help="a site file (YAML)")
    show.add_argument("--pilot-script", action="store_true", help="print the batch script of the next pilot "
                      "instead (a dry run: nothing is submitted)")
    actions.add_parser("check", help="ask each site's scheduler whether it would take the site's pilots: the "
                       "partition has nodes and sbatch --test-only accepts a pilot (PBS: qstat -Q knows the queue); "
                       "nothing is submitted; exit 1 if one would not").add_argument(
        "files", nargs="+", metavar="FILE", help="site files (YAML)")
    actions.add_parser("schema", help="the reference of every site-file field (Markdown)")
    si.set_defaults(func=cmd_sites)


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG)


def _out_of_room(e: OSError | sqlite3.OperationalError) -> bool:
    """A full disk or quota, a read-only file system, a path too long (the state directory's, mid-run): the
    user's to fix, said in one line rather than a traceback."""
    if isinstance(e, OSError):
        return e.errno in _NO_ROOM
    return any(w in str(e) for w in ("disk is full", "readonly database", "disk I/O error"))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Every deliberate error (a ParslBftError: a user's mistake, or trouble the user can fix) is one line on
    stderr and exit code 2; ``--debug`` shows the traceback instead. Anything else is a bug and shows its traceback,
    a plain ValueError included."""
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    warnings.filterwarnings("ignore", category=DeprecationWarning)   # library deprecations are not the user's
    warnings.formatwarning = lambda msg, *a, **k: f"warning: {msg}\n"
    try:
        with optional_imports():            # a command needing an extra that is not installed: one line
            return args.func(args)
    except ParslBftError as e:
        if args.debug:
            raise
        msg = str(e) if "Traceback" in str(e) else _one_line(e)    # a failed job: the rank's whole traceback
        print(f"parsl-bft {args.cmd}: error: {msg}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.OperationalError) as e:
        if args.debug or not _out_of_room(e):
            raise
        print(f"parsl-bft {args.cmd}: error: {_one_line(e)} (--debug shows where)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:       # Ctrl-C or SIGTERM (a session turns it into this): already cleaned up
        if args.debug:
            raise
        print(f"parsl-bft {args.cmd}: interrupted: running fragments checkpointed, nodes given back; run it again "
              "with the same state directory to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
