"""The planner's methods (what ``Planner(method=...)`` accepts): a module of its own so that the command line
can offer them without importing a MILP solver."""
from __future__ import annotations

METHODS = ("milp", "dp", "greedy", "equal-share", "node-milp")
