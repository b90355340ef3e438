import os
from pathlib import Path

import pytest
from hypothesis import settings

# The same examples on every run (CI included), so a property test cannot pass locally and fail on the next
# clone by drawing new ones; HYPOTHESIS_PROFILE=explore draws fresh examples to hunt for new failures.
settings.register_profile("repro", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repro"))

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PARSL_BFT_SHARED", ROOT.parent / "shared")) / "data"
FIXTURES = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.exists():
        pytest.fail(f"shared data not found at {SHARED}: check out ../shared beside the project "
                    "or set PARSL_BFT_SHARED")
    return SHARED
