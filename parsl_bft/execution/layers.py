"""Layer elasticity in the runtime: the planner's view of a freezable job (its layer profile, measured once from
its model) and what a finished fragment tells it (gradient statistics, budget spent at the level it ran)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BadValue
from ..planner.freeze import LayerThroughput, charge_budget
from ..planner.problem import JobState
from ..scaling import LayerProfile, ScalingCurve

if TYPE_CHECKING:
    from ..train.config import FragmentResult


def job_layers(name: str, workload: str, global_batch: int, workload_args: dict[str, Any],
               curve: ScalingCurve) -> LayerThroughput:
    """The frozen shares of the job's model (one forward pass here), on its current throughput curve; the
    planner predicts the frozen rates from them until fragments measure more."""
    from ..train.profiler import measure_layer_shares

    n, shares = measure_layer_shares(workload, global_batch, workload_args)
    if n < 2:
        raise BadValue(f"job {name!r}: freeze='auto' but its model has {n} layer (Workload.blocks): nothing to "
                       "freeze while something still trains")
    return LayerThroughput(curve, LayerProfile(name, n, shares))


def fragment_reported(state: JobState, result: FragmentResult) -> None:
    """Before the job's progress is updated: charge the fragment's new progress at the level it ran to the
    budget, keep its statistics, and follow a re-measured curve."""
    if state.layers is None:
        return
    layers = state.layers
    charge_budget(state, (result.samples_done - state.samples_done) / state.spec.samples)
    state.grad_stats = result.grad_stats or state.grad_stats
    if layers.curve is not state.curve:
        state.layers = LayerThroughput(state.curve, layers.profile)
