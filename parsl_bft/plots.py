"""Plots shared by the simulator and the runtime."""
from __future__ import annotations

import numpy as np

from .extras import optional_imports


def plot_allocation(times: list[float], idle: list[int], by_key: list[dict[str, int]], end: float, path: str, *,
                    title: str = "", xlabel: str = "hours since the first event", scale: float = 3600.0) -> None:
    """Idle nodes (line) and the nodes each key (model or job) holds (stacked), as step functions."""
    with optional_imports():
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    t = (np.array([*times, end]) - (times[0] if times else 0.0)) / scale
    keys = sorted({k for d in by_key for k in d})
    last = by_key[-1] if by_key else {}
    stacks = np.array([[d.get(k, 0) for d in by_key] + [last.get(k, 0)] for k in keys]) if keys else None
    fig, ax = plt.subplots(figsize=(11, 4.5))
    if stacks is not None:
        ax.stackplot(t, stacks, labels=keys, step="post", alpha=0.85)
    ax.step(t, [*idle, idle[-1] if idle else 0], where="post", color="black", lw=0.9, label="idle nodes")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("nodes")
    ax.set_xlim(0, t[-1] if len(t) else 1)
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
