"""How often a fragment saves without being asked: Young's interval sqrt(2 C M) from what the orchestrator
has seen. C is the measured save time; M the mean time between losses WITHOUT notice (a pilot killed, a node
crash, a lost worker pool) of a fragment on n nodes, estimated from the node-seconds held and the losses
counted so far, starting from a prior of one loss per ``prior_mtbf_node_s``. A known hole end caps the interval
at half the time left, so a hole that ends without its notice still keeps half of its work. The books also keep
how long the last stops took (``stop_s``): a pilot's walltime notice needs no more lead than that."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import BadValue
from ..save_interval import MAX_INTERVAL_S, MIN_INTERVAL_S, PRIOR_MTBF_NODE_S, mtbf_node_s, young_interval

STOPS_KEPT = 20


@dataclass
class CheckpointPolicy:
    """The books the interval comes from (measured saves, node-seconds trained, losses without notice) and the
    interval itself (the module docstring says how)."""

    prior_mtbf_node_s: float = PRIOR_MTBF_NODE_S
    prior_save_s: float = 1.0
    min_interval_s: float = MIN_INTERVAL_S   # never spend more than C / min_interval of the time saving
    max_interval_s: float = MAX_INTERVAL_S
    exposure_node_s: float = 0.0     # node-seconds fragments have trained
    losses: int = 0                  # fragments lost without notice
    save_s: float | None = None      # running mean of measured saves
    saves: int = 0
    stops: list[float] = field(default_factory=list)   # the last STOPS_KEPT stops: request -> fragment collected

    def __post_init__(self) -> None:
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise BadValue(f"need 0 < min_interval_s <= max_interval_s, got {self.min_interval_s}, "
                           f"{self.max_interval_s}")

    def observe_save(self, seconds: float) -> None:
        """A fragment saved in ``seconds``: the running mean of C learns it."""
        if seconds > 0:
            self.saves += 1
            self.save_s = seconds if self.save_s is None else self.save_s + (seconds - self.save_s) / self.saves

    def observe_stop(self, asked: float | None, collected: float, step_s: float = 0.0) -> None:
        """A fragment asked to stop at ``asked`` (None: it was not) was collected at ``collected``: it finished its
        step, saved and exited in between. Kept as what that stop would have taken had the request come as a step
        began (plus ``step_s``, the fragment's time per step): one that came at a step's end says little about the
        next."""
        if asked is not None:
            self.stops = [*self.stops, max(collected - asked, 0.0) + max(step_s, 0.0)][-STOPS_KEPT:]

    @property
    def stop_s(self) -> float | None:
        """How long a stop takes, as the slowest of the last stops; None: none seen yet."""
        return max(self.stops) if self.stops else None

    def observe_training(self, node_seconds: float, lost_without_notice: bool) -> None:
        """A fragment ended after ``node_seconds`` of training, lost without notice or not: M learns it."""
        self.exposure_node_s += max(node_seconds, 0.0)
        self.losses += int(lost_without_notice)

    def mtbf_node_s(self) -> float:
        """M for one node: (prior + node-seconds trained) / (1 + losses without notice)."""
        return mtbf_node_s(self.exposure_node_s, self.losses, self.prior_mtbf_node_s)

    def interval(self, nodes: int, hole_left_s: float = math.inf) -> float:
        """Seconds between saves for a fragment on ``nodes`` nodes whose hole ends in ``hole_left_s``."""
        c = self.save_s if self.save_s is not None else self.prior_save_s
        return young_interval(c, self.mtbf_node_s(), nodes, hole_left_s, self.min_interval_s, self.max_interval_s)

    def state(self) -> dict[str, Any]:
        """The books as plain data (the state directory keeps them across runs)."""
        return asdict(self)
