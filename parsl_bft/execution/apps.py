"""The Parsl app that runs one training fragment (imported by Parsl workers, so keep it light)."""
from __future__ import annotations


def fragment_task(cfg: dict, parsl_resource_specification: dict | None = None) -> dict:
    """Run a fragment of ``cfg["world_size"]`` ranks and return its FragmentResult as a dict.

    ``parsl_resource_specification`` (e.g. {"num_nodes": n}) is read by Parsl's executors, not by us."""
    from dataclasses import asdict

    from parsl_bft.train.fragment import FragmentConfig, run_fragment

    return asdict(run_fragment(FragmentConfig(**cfg)))
