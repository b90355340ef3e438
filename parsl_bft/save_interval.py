"""Young's checkpoint interval, shared by the runtime's policy (execution/checkpoint_policy.py) and the
simulator's measured cost model (sim/costs.py): tau = sqrt(2 C M / n) for a save of C seconds and a mean time
between losses without notice of M node-seconds, on n nodes; a known hole end caps it at half the time left."""
from __future__ import annotations

import math

PRIOR_MTBF_NODE_S = 6 * 3600.0    # one loss without notice per 6 node-hours until losses are counted
MIN_INTERVAL_S = 5.0              # never spend more than C / min_interval of the time saving
MAX_INTERVAL_S = 900.0


def mtbf_node_s(exposure_node_s: float, losses: float, prior_node_s: float = PRIOR_MTBF_NODE_S) -> float:
    """M for one node: (prior + node-seconds trained) / (1 + losses without notice)."""
    return (prior_node_s + exposure_node_s) / (1 + losses)


def young_interval(save_s: float, mtbf_node_s: float, nodes: int, hole_left_s: float = math.inf,
                   min_s: float = MIN_INTERVAL_S, max_s: float = MAX_INTERVAL_S) -> float:
    """Seconds between saves for a fragment on ``nodes`` nodes whose hole ends in ``hole_left_s``."""
    tau = math.sqrt(2.0 * save_s * mtbf_node_s / max(nodes, 1))
    if math.isfinite(hole_left_s):
        tau = min(tau, hole_left_s / 2)
    return min(max_s, max(min_s, tau))
