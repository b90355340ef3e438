"""The planner's option knobs (what ``Planner(method=..., solver=..., horizon_model=...)`` accepts): a module of its
own so that the command line can offer them without importing a MILP solver."""
from __future__ import annotations

from typing import Literal, get_args

PlannerMethod = Literal["milp", "dp", "greedy", "equal-share", "node-milp"]
Solver = Literal["highs", "cbc"]               # the MILP solver (PuLP's)
HorizonModel = Literal["hazard", "cut"]        # how predicted remaining idle time is valued (build_problem)

METHODS: tuple[PlannerMethod, ...] = get_args(PlannerMethod)
SOLVERS: tuple[Solver, ...] = get_args(Solver)
HORIZON_MODELS: tuple[HorizonModel, ...] = get_args(HorizonModel)
