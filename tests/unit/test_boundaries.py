"""The design's import rules: the planner knows nothing of Parsl, the training runtime nothing of the MILP."""
import subprocess
import sys

import pytest


def imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_planner_does_not_import_parsl():
    assert "parsl" not in imported_after("parsl_bft.planner")
    assert "parsl" not in imported_after("parsl_bft.sim")


@pytest.mark.slow
def test_training_runtime_does_not_import_the_milp():
    mods = imported_after("parsl_bft.train.fragment, parsl_bft.train.profiler, parsl_bft.train.checkpoint")
    assert "pulp" not in mods and "highspy" not in mods
