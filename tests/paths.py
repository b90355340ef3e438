"""Where the tests find things: the project root, the shared data folder, the tests' own fixtures."""
import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SHARED = Path(os.environ.get("PARSL_BFT_SHARED", ROOT.parent / "shared")) / "data"
FIXTURES = TESTS / "data"
