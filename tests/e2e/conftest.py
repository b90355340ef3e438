"""End-to-end tests: real Parsl executors, real torch.distributed ranks, real Slurm. Every one is marked slow, so
the inner loop (pytest -m "not slow and not slurm") leaves them out."""
import pytest


def pytest_collection_modifyitems(config, items):
    """Mark every test of this folder slow."""
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.slow)
