"""Allocation planner (BFTrainer's MILP, exact and fast). Knows nothing of Parsl.

The names below are loaded on first use (PEP 562): importing this package, or a submodule that needs no solver
(problem, objectives, methods, placement, ...), does not import PuLP or HiGHS, so ``parsl-bft --help`` and the
training runtime stay free of them. ``Planner`` and ``build_problem`` bring the solvers in.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .methods import METHODS
    from .objectives import (
        OBJECTIVES,
        DeadlineAware,
        MaxMinFair,
        Objective,
        ProportionalFair,
        Speedup,
        Throughput,
        UserDefined,
        Weighted,
        make_objective,
    )
    from .placement import Placement, place
    from .planner import Planner, build_problem
    from .problem import JobState, Plan, SizeProblem

_WHERE = {
    "OBJECTIVES": "objectives", "DeadlineAware": "objectives", "MaxMinFair": "objectives", "Objective": "objectives",
    "ProportionalFair": "objectives", "Speedup": "objectives", "Throughput": "objectives",
    "UserDefined": "objectives", "Weighted": "objectives", "make_objective": "objectives",
    "Placement": "placement", "place": "placement",
    "METHODS": "methods", "Planner": "planner", "build_problem": "planner",
    "JobState": "problem", "Plan": "problem", "SizeProblem": "problem",
}

__all__ = ["METHODS", "OBJECTIVES", "DeadlineAware", "JobState", "MaxMinFair", "Objective", "Placement", "Plan",
           "Planner", "ProportionalFair", "SizeProblem", "Speedup", "Throughput", "UserDefined", "Weighted",
           "build_problem", "make_objective", "place"]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use, and keep the name here."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the lazily loaded ones included."""
    return sorted(set(globals()) | set(__all__))
