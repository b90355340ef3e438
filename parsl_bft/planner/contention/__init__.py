"""Contention-aware scheduling of ring-all-reduce jobs (SJF-BCO, Yu et al. MobiHoc 2022): the cost model
(eqs. 6-8), the paper's slotted offline setting, SJF-BCO and its baselines, an exact MILP for small instances.
No Parsl here; the MILP module imports PuLP only when used."""
from .engine import Outcome, Schedule, run
from .instance import PAPER_MIX, Instance, paper_instance
from .model import CommParams, contention, degradation, iteration_time, iterations_per_slot
from .policies import (
    POLICIES,
    BcoResult,
    first_fit,
    first_fit_backfill,
    list_scheduling,
    random_placement,
    random_servers,
    sjf_bco,
    sjf_bco_trial,
)

__all__ = ["PAPER_MIX", "POLICIES", "BcoResult", "CommParams", "Instance", "Outcome", "Schedule", "contention",
           "degradation", "first_fit", "first_fit_backfill", "iteration_time", "iterations_per_slot",
           "list_scheduling", "paper_instance", "random_placement", "random_servers", "run", "sjf_bco",
           "sjf_bco_trial"]
