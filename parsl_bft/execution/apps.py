"""The Parsl apps that run training fragments (imported by Parsl workers, so keep them light)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parsl_bft.train.config import FragmentConfig, FragmentResult


def fragment_task(cfg: FragmentConfig, store: str | None = None,
                  parsl_resource_specification: dict[str, Any] | None = None) -> FragmentResult:
    """Run all ``cfg.world_size`` ranks of a fragment on this node; returns its result.
    ``store``: the orchestrator's rendezvous store (host:port); None: one served here (a lone fragment).

    ``parsl_resource_specification`` is read by Parsl's executors, not by us."""
    from parsl_bft.train.config import FragmentFailed
    from parsl_bft.train.launcher import run_fragment

    res = run_fragment(cfg, store=store)
    if res is None:          # all ranks ran here, rank 0 among them: it reports or the launcher raises
        raise FragmentFailed(f"fragment {cfg.fragment_id} of {cfg.job}: rank 0 returned no result")
    return res


def fragment_node_task(cfg: FragmentConfig, node_index: int, store: str) -> FragmentResult | None:
    """One node's share (``ranks_per_node`` ranks) of a fragment spread over nodes by the executor;
    the share with rank 0 returns the result, the others None."""
    from parsl_bft.train.launcher import run_gang_task

    return run_gang_task(cfg, node_index, store)


def warm_up(barrier: str, n: int, timeout_s: float = 120.0) -> str:
    """Start this worker's rank forkserver (torch and the fragment code imported once) before any node is
    planned, so the first fragment on it starts in a second; returns the node it ran on. ``n`` of these meet at
    ``barrier`` (a directory): each waits for the others, so every one of the executor's n workers runs exactly
    one (n = 1: no barrier). The worker itself never imports torch (launcher.claim_share)."""
    import os
    import socket
    import time
    from pathlib import Path

    from parsl_bft.train.launcher import node_name, start_rank_server

    start_rank_server()
    if n <= 1:
        return node_name()
    d = Path(barrier)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{socket.gethostname()}-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(d.iterdir())) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return node_name()
