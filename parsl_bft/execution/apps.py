"""The Parsl apps that run training fragments (imported by Parsl workers, so keep them light)."""
from __future__ import annotations


def fragment_task(cfg: dict, store: str | None = None, parsl_resource_specification: dict | None = None) -> dict:
    """Run all ``cfg["world_size"]`` ranks of a fragment on this node; returns its FragmentResult as a dict.
    ``store``: the orchestrator's rendezvous store (host:port); None: one served here (a lone fragment).

    ``parsl_resource_specification`` is read by Parsl's executors, not by us."""
    from dataclasses import asdict

    from parsl_bft.train.fragment import FragmentConfig
    from parsl_bft.train.launcher import run_fragment

    return asdict(run_fragment(FragmentConfig(**cfg), store=store))


def fragment_node_task(cfg: dict, node_index: int, store: str) -> dict | None:
    """One node's share (``ranks_per_node`` ranks) of a fragment spread over nodes by the executor;
    the share with rank 0 returns the FragmentResult as a dict, the others None."""
    from dataclasses import asdict

    from parsl_bft.train.fragment import FragmentConfig
    from parsl_bft.train.launcher import run_gang_task

    res = run_gang_task(FragmentConfig(**cfg), node_index, store)
    return asdict(res) if res is not None else None


def warm_up(barrier: str, n: int, timeout_s: float = 120.0) -> str:
    """Start this worker's rank forkserver (torch and the fragment code imported once) before any node is
    planned, so the first fragment on it starts in a second. ``n`` of these meet at ``barrier`` (a directory):
    each waits for the others, so every one of the executor's n workers runs exactly one (n = 1: no barrier)."""
    import os
    import socket
    import time
    from pathlib import Path

    from parsl_bft.train.launcher import start_rank_server

    start_rank_server()
    if n <= 1:
        return f"{socket.gethostname()}:{os.getpid()}"
    d = Path(barrier)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{socket.gethostname()}-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(d.iterdir())) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"{socket.gethostname()}:{os.getpid()}"
