"""``parsl-bft metrics``: a job's training metrics (its metrics.csv, written by rank 0 as it trains) as a table,
as CSV on stdout, or drawn against the step."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .cli_simulate import make_console
from .csvio import check_output_path
from .errors import UsageError


def add_metrics_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``metrics`` subcommand."""
    m = sub.add_parser("metrics", help="a job's training metrics (loss, evaluation metrics per step): a table, CSV "
                       "or a plot")
    m.add_argument("state", nargs="?", default="bft-state", help="the state directory (default bft-state)")
    m.add_argument("job", nargs="?", help="the job (default: the state directory's only one)")
    m.add_argument("--csv", action="store_true", help="write the metrics as CSV to stdout")
    m.add_argument("--plot", metavar="FILE", help="draw loss and each evaluation metric against the step into FILE "
                   "(.png, .pdf, .svg)")
    m.add_argument("--tensorboard", metavar="DIR", help="write them as TensorBoard event files into DIR/<job> "
                   "(then: tensorboard --logdir DIR); again later, the job's file there is replaced")
    m.add_argument("--last", type=int, default=20, metavar="N", help="rows in the table: the last N steps (default "
                   "20; 0: all)")
    m.set_defaults(func=cmd_metrics)


def cmd_metrics(args: argparse.Namespace) -> int:
    """A job's metrics.csv: a table of its last steps, the file itself (--csv), a plot (--plot)."""
    from .execution.report import metrics_file
    from .train.metrics import read_metrics

    if args.last < 0:
        raise UsageError(f"--last must be >= 0, got {args.last}")
    check_output_path(args.plot, "--plot")
    try:
        job, path = metrics_file(args.state, args.job)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    columns, rows = read_metrics(path)
    if not rows:
        raise UsageError(f"job {job!r} has no metrics yet ({path} is written by its rank 0 as it trains)")
    if args.tensorboard:
        print(f"wrote {write_tensorboard(job, rows, args.tensorboard)}", file=sys.stderr)
    if args.csv:
        sys.stdout.write(path.read_text())
    elif not args.plot and not args.tensorboard:
        _table(job, columns, rows, args.last)
        _best(path.parent)
    if args.plot:
        plot_metrics(job, columns, rows, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr if args.csv else sys.stdout)
    return 0


def _table(job: str, columns: list[str], rows: list[dict[str, float]], last: int) -> None:
    from rich.table import Table

    shown = rows[-last:] if last else rows
    t = Table(title=f"metrics of job {job}")
    for c in columns:
        t.add_column(c, justify="right")
    for r in shown:
        t.add_row(*(_fmt(r[c]) if c in r else "" for c in columns))
    console = make_console()
    console.print(t)
    if len(shown) < len(rows):
        console.print(f"the last {len(shown)} of {len(rows):,} steps (--last 0: all; --csv: the file)")


def _best(job_dir: Path) -> None:
    """The kept best checkpoint (``keep_best``), if the job keeps one."""
    from .train.best import BEST, read_best

    best = read_best(job_dir)
    if best is not None:
        how = "highest" if best.get("higher") else "lowest"
        print(f"best by {best['metric']} ({how}): {_fmt(best['value'])} at step {best['step']}: {job_dir / BEST}")


def _fmt(v: float) -> str:
    return str(int(v)) if math.isfinite(v) and v == int(v) and abs(v) < 1e15 else f"{v:.5g}"


def write_tensorboard(job: str, rows: list[dict[str, float]], out: str | Path) -> Path:
    """The job's metrics as one TensorBoard event file in ``out/<job>`` (what was there before for the job goes:
    metrics.csv is the one history, each step once, so an export never duplicates a resumed fragment's steps)."""
    from .extras import optional_imports

    with optional_imports():
        import tensorboard  # noqa: F401  (torch's writer needs it; missing: which extra installs it)
    from torch.utils.tensorboard import SummaryWriter

    d = Path(out) / job
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("events.out.tfevents.*"):
        old.unlink()
    with SummaryWriter(log_dir=str(d)) as w:
        for r in rows:
            for name, v in r.items():
                if name != "step":
                    w.add_scalar(name, v, int(r["step"]))
    return d


def plot_metrics(job: str, columns: list[str], rows: list[dict[str, float]], path: str | Path) -> None:
    """Loss, then each other metric a step recorded (evaluation results at the steps where they ran), against
    the step: one panel each, sharing the step axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [c for c in columns if c not in ("step", "world")]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.6 * len(metrics)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], metrics):
        pts = [(r["step"], r[name]) for r in rows if name in r]
        sparse = len(pts) < len(rows) / 2           # evaluation metrics: points, joined
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if sparse else "-", lw=1, ms=3)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(f"job {job}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
