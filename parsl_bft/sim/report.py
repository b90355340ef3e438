"""Tables and plots of a replay."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..plots import plot_allocation
from .replay import SimResult

if TYPE_CHECKING:
    from rich.console import Console


def plot_replay(res: SimResult, path: str, title: str = "") -> None:
    """Idle nodes over time and the nodes each model holds (stacked)."""
    m = res.metrics()
    tl = res.timeline
    plot_allocation(tl.t, tl.idle, tl.held, res.end, path,
                    title=title or f"[{m['cost_model']} costs] E_idle {m['e_idle']:.3f}  E_used {m['e_used']:.3f}  "
                                   f"util {m['util']:.3f}  "
                                   f"jobs finished {m['jobs_finished']}")


def print_summary(res: SimResult, console: Console, title: str = "") -> None:
    """The replay's metrics and a per-model table, on ``console``."""
    from rich.table import Table

    m = res.metrics()
    t = Table(title=title or "replay", show_header=False)
    rows: list[tuple[str, str]] = [("cost_model", "{}"), ("e_idle", "{:.3f}"), ("e_used", "{:.3f}")]
    if "ceiling_e_idle" in m:
        rows += [("ceiling_e_idle", "{:.3f}  (free rescales and reclaims: the limit)"),
                 ("ceiling_e_used", "{:.3f}")]
        m["e_idle / ceiling"] = m["e_idle"] / m["ceiling_e_idle"] if m["ceiling_e_idle"] else 0.0
        rows += [("e_idle / ceiling", "{:.3f}")]
    for k, fmt in [*rows, ("util", "{:.3f}"), ("samples", "{:,.0f}"),
                   ("rescale_loss", "{:,.0f} samples"), ("reclaim_loss", "{:,.0f} samples"),
                   ("save_loss", "{:,.0f} samples (periodic saves' stalls)"),
                   ("jobs_finished", "{}"), ("events", "{}"), ("plans", "{}"),
                   ("solve_p50_s", "{:.4f} s"), ("solve_p99_s", "{:.4f} s"), ("avg_jct_s", "{:,.0f} s"),
                   ("makespan_s", "{:,.0f} s"), ("frozen_share", "{:.1%} of node-seconds with layers frozen"),
                   ("budget_violations", "{} jobs over their accuracy budget")]:
        t.add_row(k, fmt.format(m[k]))
    console.print(t)
    pm = Table(title="per model")
    for c in ("model", "jobs", "finished", "samples", "node-hours", "E_used"):
        pm.add_column(c, justify="right")
    for r in res.per_model():
        pm.add_row(r["model"], str(r["jobs"]), str(r["finished"]), f"{r['samples']:,.0f}",
                   f"{r['node_s'] / 3600:,.1f}", f"{r['e_used']:.3f}")
    console.print(pm)
