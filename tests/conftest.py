"""Shared by every test folder: tests/ on sys.path (the helpers harness, orchestrate, globus_standin, import_graph
are imported by name), hypothesis profiles, and the shared data fixture.

Folders: unit/ (seconds each; a few marked slow), fuzz/ (hostile inputs), e2e/ (real Parsl executors, real
torch.distributed ranks, real Slurm; each such test marked slow). Fakes shared by several modules are in fakes.py
(test modules never import each other). The inner loop: pytest -m "not slow and not slurm"."""
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# The same examples on every run (CI included), so a property test cannot pass locally and fail on the next
# clone by drawing new ones; HYPOTHESIS_PROFILE=explore draws fresh examples to hunt for new failures.
settings.register_profile("repro", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repro"))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paths import FIXTURES, ROOT, SHARED  # noqa: E402

__all__ = ["FIXTURES", "ROOT", "SHARED"]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.exists():
        pytest.fail(f"shared data not found at {SHARED}: check out ../shared beside the project "
                    "or set PARSL_BFT_SHARED")
    return SHARED


def pytest_collection_modifyitems(config, items):
    """A test that needs the local Slurm is slow too: `-m slow` selects it, `-m "not slow"` leaves it out."""
    for item in items:
        if item.get_closest_marker("slurm") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
