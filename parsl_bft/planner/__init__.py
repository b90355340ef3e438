"""Allocation planner (BFTrainer's MILP, exact and fast). Knows nothing of Parsl."""
from .objectives import (OBJECTIVES, DeadlineAware, MaxMinFair, Objective, ProportionalFair, Speedup, Throughput,
                         UserDefined, Weighted, make_objective)
from .placement import Placement, place
from .planner import METHODS, Planner, build_problem
from .problem import JobState, Plan, SizeProblem

__all__ = ["OBJECTIVES", "DeadlineAware", "MaxMinFair", "Objective", "ProportionalFair", "Speedup", "Throughput",
           "UserDefined", "Weighted", "make_objective", "Placement", "place", "METHODS", "Planner", "build_problem",
           "JobState", "Plan", "SizeProblem"]
