"""``parsl-bft submit / status RUN_ID / logs / cancel / fetch``: the CLI of remote runs (parsl_bft.cli wires them)."""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..execution.jobstore import JobStatus
from .facility import END_STATES
from .registry import known_runs, remember

if TYPE_CHECKING:
    from rich.console import Console

    from .client import RemoteSession


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add submit, logs, cancel and fetch to the ``parsl-bft`` command line."""
    s = sub.add_parser("submit", help="start a workflow at a facility through its Globus Compute endpoint; "
                       "prints the run id")
    _submit_options(s)
    s.add_argument("workflow", help="the workflow file (Python) to run at the facility")
    s.add_argument("args", nargs=argparse.REMAINDER, help="passed to the workflow as sys.argv[1:] (the options "
                   "above may come after the workflow too)").required = False    # may be empty (see cli.py's run)
    s.set_defaults(func=cmd_submit)
    for name, func, what in (("logs", cmd_logs, "the log of a submitted run's session"),
                             ("cancel", cmd_cancel, "stop a submitted run (it checkpoints; submit again resumes)"),
                             ("fetch", cmd_fetch, "where a submitted run's newest checkpoints are (final ones of "
                                                  "finished jobs), or (--checkpoint) copy them here")):
        p = sub.add_parser(name, help=what)
        p.add_argument("run_id", help="the run id submit printed")
        add_site_arg(p)
        p.set_defaults(func=func)
        if name == "logs":
            p.add_argument("--follow", action="store_true", help="keep printing until the session ends")
        if name == "cancel":
            p.add_argument("--wait", action="store_true", help="return once the session has stopped")
        if name == "fetch":
            p.add_argument("--checkpoint", action="store_true", help="copy the checkpoints (in chunks)")
            p.add_argument("--job", action="append", help="only this job (repeatable)")
            p.add_argument("--out", help="folder for the checkpoints (default: ./RUN_ID)")


def _submit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", help="a site file naming the facility's globus_compute_endpoint (required)")
    p.add_argument("--file", action="append", default=[], help="another file to ship (in the workflow's folder; "
                   "the files the workflow names are found by themselves)")
    p.add_argument("--run-id", help="name the run (default: the workflow's name and a digest of what is shipped)")


def add_site_arg(p: argparse.ArgumentParser) -> None:
    """``--site``: the endpoint's site file (stored as ``remote_site``; ``run --site`` means another thing)."""
    p.add_argument("--site", dest="remote_site", help="the endpoint's site file (default: the one the run id was "
                   "submitted with from this machine)")


def wants_remote(args: argparse.Namespace) -> bool:
    """``parsl-bft status X`` means a remote run when --site is given (the endpoint's site file), or X is a run
    id submitted from here and no local directory of that name exists."""
    if getattr(args, "remote_site", None):
        return True
    return not Path(args.state).exists() and args.state in known_runs()


def _session(args: argparse.Namespace) -> AbstractContextManager[RemoteSession]:
    from .client import remote_session

    site = args.remote_site or known_runs().get(args.run_id)
    if not site:
        raise UsageError(f"run {args.run_id} was not submitted from this machine: name its site file with --site")
    return remote_session(site)


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def cmd_submit(args: argparse.Namespace) -> int:
    """Ship a workflow to the facility named by --site and start it there; prints the run id."""
    # no abbreviations: a workflow's own --run or --s after the workflow is the workflow's, not --run-id / --site
    after = argparse.ArgumentParser(prog="parsl-bft submit", add_help=False, allow_abbrev=False)
    _submit_options(after)                 # parsl-bft submit W.py --site S.yaml ARGS, as with parsl-bft run
    late, args.args = after.parse_known_args(args.args)
    args.site, args.run_id = late.site or args.site, late.run_id or args.run_id
    args.file = [*args.file, *late.file]
    if not args.site:
        raise UsageError("submit needs --site: a site file naming the facility's globus_compute_endpoint")
    from .bundle import make_bundle
    from .client import endpoint_site, remote_session
    from .facility import check_run_id

    if args.run_id:
        check_run_id(args.run_id)
    endpoint_site(args.site)               # a bad site or workflow fails before the service is asked anything
    bundle = make_bundle(args.workflow, args.args, args.file)
    with remote_session(args.site) as remote:
        run = remote.submit_bundle(bundle, run_id=args.run_id)
    remember(run.run_id, args.site)
    st = run.last
    assert st is not None                  # submit_bundle keeps the start's answer
    verb = "started" if st["started"] else f"already submitted ({st['state']}): nothing started"
    _say(f"run {run.run_id}: {verb}; at the facility in {st['folder']} on {st['host']}")
    print(run.run_id)
    return 0


def print_status(st: dict[str, Any], console: Console) -> None:
    """A run's status as one line and a table of its jobs."""
    from rich.table import Table

    code = f", exit code {st['exit_code']}" if st["exit_code"] is not None else ""
    print(f"run {st['run_id']}: {st['state']}{code} ({st['folder']} on {st['host']})")   # one line, never wrapped
    t = Table()
    for c in ("state dir", "job", "status", "progress", "nodes now", "fragments"):
        t.add_column(c, justify="right")
    for r in st["jobs"]:
        total = r["samples"] or 0
        t.add_row(r["state"], r["job"], r["status"], f"{r['samples_done'] / total:.1%} of {total:,}" if total
                  else "?", str(r["nodes"]), str(r["fragments"]))
    console.print(t)


def cmd_remote_status(args: argparse.Namespace) -> int:
    """A remote run's status: its state and each job's progress."""
    from rich.console import Console

    args.run_id = args.state
    with _session(args) as remote:
        print_status(remote.run(args.run_id).status(), Console())
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Print the run's session log (--follow: until the session ends)."""
    with _session(args) as remote:
        run = remote.run(args.run_id)
        out = run.logs()
        print(out["text"], end="")
        while args.follow:
            if run.status()["state"] in END_STATES:
                args.follow = False         # one more read: what the session wrote as it ended
            else:
                time.sleep(5)
            out = run.logs(out["offset"])
            print(out["text"], end="", flush=True)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Ask the run to checkpoint and stop (--wait: until it has)."""
    with _session(args) as remote:
        run = remote.run(args.run_id)
        st = run.cancel()
        while args.wait and st["state"] not in END_STATES:
            time.sleep(5)
            st = run.status()
    _say(f"run {args.run_id}: {st['state']}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """One line per job with a checkpoint: its name and its newest checkpoint - the final one of a finished job -
    at the facility, or the copy here; a job not finished says so on stderr."""
    from .client import with_checkpoint

    with _session(args) as remote:
        run = remote.run(args.run_id)
        status = run.status()
        rows = with_checkpoint(status, args.job)
        got = run.fetch(args.out or args.run_id, args.job, status) if args.checkpoint else \
            {r["job"]: r["checkpoint"] for r in rows}
    for name, path in got.items():
        print(f"{name}\t{path}")
    for r in rows:
        if r["status"] != JobStatus.DONE:
            _say(f"{r['job']}: {r['status']}, not finished: its newest checkpoint ({r['samples_done']:,} of "
                 f"{r['samples']:,} samples)")
    if not got:
        _say(f"run {args.run_id}: no job has a checkpoint yet")
    return 0
