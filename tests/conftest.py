import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PARSL_BFT_SHARED", ROOT.parent / "shared")) / "data"
FIXTURES = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.exists():
        pytest.fail(f"shared data not found at {SHARED}: check out ../shared beside the project "
                    "or set PARSL_BFT_SHARED")
    return SHARED
