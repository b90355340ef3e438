"""Contention-aware scheduling of ring-all-reduce jobs (SJF-BCO, Yu et al. MobiHoc 2022): the cost model
(eqs. 6-8), the paper's slotted offline setting, SJF-BCO and its baselines, an exact MILP for small instances.
No Parsl here; the MILP module imports PuLP only when used."""
from .baselines import Baseline, BaselineResult, paper_baseline
from .booking import JobOrder, Start
from .engine import Outcome, Schedule, run
from .instance import (
    PAPER_MIX,
    Instance,
    binding_instance,
    faithful_instance,
    lower_bound,
    paper_instance,
)
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

__all__ = ["PAPER_MIX", "POLICIES", "Baseline", "BaselineResult", "BcoResult", "CommParams", "Instance", "JobOrder",
           "Outcome", "Schedule", "Start", "binding_instance", "contention", "degradation", "faithful_instance",
           "first_fit", "first_fit_backfill", "iteration_time", "iterations_per_slot", "list_scheduling",
           "lower_bound", "paper_baseline", "paper_instance", "random_placement", "random_servers", "run",
           "sjf_bco", "sjf_bco_trial"]
