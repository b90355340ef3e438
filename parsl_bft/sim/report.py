"""Tables and plots of a replay."""
from __future__ import annotations

import numpy as np

from .replay import SimResult


def plot_replay(res: SimResult, path: str, title: str = "") -> None:
    """Idle nodes over time and the nodes each model holds (stacked)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = res.timeline
    t = (np.array(tl.t + [res.end]) - res.start) / 3600.0
    models = sorted({m for d in tl.by_model for m in d})
    stacks = np.array([[d.get(m, 0) for d in tl.by_model] + [tl.by_model[-1].get(m, 0) if tl.by_model else 0]
                       for m in models]) if models else np.zeros((0, len(t)))
    idle = np.array(tl.idle + [tl.idle[-1] if tl.idle else 0])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    if len(models):
        ax.stackplot(t, stacks, labels=models, step="post", alpha=0.85)
    ax.step(t, idle, where="post", color="black", lw=0.8, label="idle nodes")
    m = res.metrics()
    ax.set_title(title or f"E_idle {m['e_idle']:.3f}  E_used {m['e_used']:.3f}  util {m['util']:.3f}  "
                          f"jobs finished {m['jobs_finished']}")
    ax.set_xlabel("hours since the first event")
    ax.set_ylabel("nodes")
    ax.set_xlim(0, t[-1] if len(t) else 1)
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_summary(res: SimResult, console, title: str = "") -> None:
    from rich.table import Table

    m = res.metrics()
    t = Table(title=title or "replay", show_header=False)
    for k, fmt in (("e_idle", "{:.3f}"), ("e_used", "{:.3f}"), ("util", "{:.3f}"), ("samples", "{:,.0f}"),
                   ("rescale_loss", "{:,.0f} samples"), ("reclaim_loss", "{:,.0f} samples"),
                   ("jobs_finished", "{}"), ("events", "{}"), ("plans", "{}"),
                   ("solve_p50_s", "{:.4f} s"), ("solve_p99_s", "{:.4f} s")):
        t.add_row(k, fmt.format(m[k]))
    console.print(t)
    pm = Table(title="per model")
    for c in ("model", "jobs", "finished", "samples", "node-hours", "E_used"):
        pm.add_column(c, justify="right")
    for r in res.per_model():
        pm.add_row(r["model"], str(r["jobs"]), str(r["finished"]), f"{r['samples']:,.0f}",
                   f"{r['node_s'] / 3600:,.1f}", f"{r['e_used']:.3f}")
    console.print(pm)
