"""What a resize and a reclaim cost a job in a replay: BFTrainer's model or one measured for this runtime.

``bftrainer`` (the default): the job set's own ``t_up`` / ``t_down``; every reclaim pauses the job ``t_down``
seconds, as if none were ever announced. A measured model is read from a costs file (``*.costs.csv``, one row
per model) and charges what this runtime pays:

- a planned resize, and a reclaim the runtime knows of in time, cost ``restart_s`` (stop request -> the next
  fragment's first finished step, the save at the stop included) and ``warmup_s`` (the slower steps after it);
- a reclaim without notice loses the work since the last periodic save (half an interval on average, the
  interval being Young's, as the runtime's checkpoint policy picks it) plus a restart without that save;
- every periodic save pauses training ``stall_s`` (a background save).

Which reclaims come with notice: ``notice_<cause>`` per row, the share of reclaims of that cause that do
(``Cause``). The replay calls a reclaim a ``reservation`` when the planner knew its end (``--predict easy`` or
``clairvoyant``) and a ``preemption`` otherwise (a facility job takes nodes a pilot holds).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from ..csvio import BadRows, parse_number, read_rows
from ..errors import InputError, ParslBftError
from ..jobs import JobSet
from ..save_interval import PRIOR_MTBF_NODE_S, mtbf_node_s, young_interval

BFTRAINER = "bftrainer"
MEASURED = "measured"
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "runtime.costs.csv"
REQUIRED = ["model", "restart_s", "save_s", "stall_s"]
PHASES = ("launch_s", "restore_s", "first_step_s", "warmup_s")


class Cause(Enum):
    """Why nodes were taken back, as far as the replay can tell."""

    RESERVATION = "reservation"     # the end was known ahead (an EASY reservation, a planned start)
    PREEMPTION = "preemption"       # a facility job took a pilot's nodes (Slurm signals it, then kills it)


class CostsError(ParslBftError):
    """A costs file that cannot be used for this job set."""


@dataclass(frozen=True)
class ModelCosts:
    """One model's measured costs, in seconds (a row of a costs file)."""

    model: str
    restart_s: float                # stop request -> next fragment's first finished step (save at the stop included)
    save_s: float                   # one blocking save of the training state (Young's C)
    stall_s: float                  # training paused by one background save
    launch_s: float = 0.0           # the restart's phases (what restart_s is made of, besides the save)
    restore_s: float = 0.0
    first_step_s: float = 0.0
    warmup_s: float = 0.0
    notice: dict[Cause, float] = field(default_factory=lambda: {c: 1.0 for c in Cause})
    device: str = ""
    estimate: bool = False          # derived from per-byte and per-launch figures, not measured on this model

    @property
    def resize_s(self) -> float:
        """What a planned resize (or a reclaim with notice) pauses the job: the restart and its warm-up."""
        return self.restart_s + self.warmup_s


@dataclass(frozen=True)
class CostModel:
    """A measured cost model: its name (the file's) and a row per model."""

    name: str
    rows: dict[str, ModelCosts]

    def row(self, model: str) -> ModelCosts:
        """The costs of ``model``; a CostsError names the models the file has."""
        if model not in self.rows:
            raise CostsError(f"costs {self.name}: no row for model {model!r} (it has {', '.join(sorted(self.rows))})")
        return self.rows[model]

    def check(self, jobset: JobSet) -> None:
        """Every model of ``jobset`` has a row (one error naming the missing ones)."""
        missing = sorted({j.model for j in jobset.jobs} - set(self.rows))
        if missing:
            raise CostsError(f"costs {self.name}: no row for model(s) {', '.join(missing)} of the job set "
                             f"(it has {', '.join(sorted(self.rows))})")

    def applied(self, jobset: JobSet) -> JobSet:
        """The job set with each job's t_up and t_down set to its model's restart and warm-up (what the planner
        weighs and a resize or a reclaim with notice costs)."""
        self.check(jobset)
        return dataclasses.replace(jobset, jobs=[dataclasses.replace(j, t_up=self.row(j.model).resize_s,
                                                                     t_down=self.row(j.model).resize_s)
                                                 for j in jobset.jobs])


def load_costs(path: str | Path) -> CostModel:
    """Read a costs file (columns: ``REQUIRED``, optional ``PHASES``, ``notice_<cause>``, ``device``,
    ``estimate``); a missing ``notice_<cause>`` is 1.0. Errors are one line naming the file, line and field."""
    p = str(path)
    rows: dict[str, ModelCosts] = {}
    for line, r in read_rows(path, REQUIRED, BadRows(lenient=False)):
        def num(k: str, default: float | None = None, line: int = line, r: dict[str, str] = r) -> float:
            if default is not None and not r.get(k):
                return default
            return parse_number(p, line, k, r[k], minimum=0.0)
        notice = {c: num(f"notice_{c.value}", 1.0) for c in Cause}
        for c, v in notice.items():
            if v > 1:
                raise InputError(p, line, f"notice_{c.value}", f"a share: must be <= 1, got {v:g}")
        if not r["model"]:
            raise InputError(p, line, "model", "empty")
        if r["model"] in rows:
            raise InputError(p, line, "model", f"{r['model']!r} has a row already")
        rows[r["model"]] = ModelCosts(r["model"], num("restart_s"), num("save_s"), num("stall_s"),
                                      num("launch_s", 0.0), num("restore_s", 0.0), num("first_step_s", 0.0),
                                      num("warmup_s", 0.0), notice=notice, device=r.get("device", ""),
                                      estimate=r.get("estimate", "").lower() in ("1", "true", "yes"))
    if not rows:
        raise InputError(p, 0, None, "no rows: a costs file needs one row per model")
    return CostModel(Path(p).name, rows)


def cost_model(spec: str) -> CostModel | None:
    """``bftrainer`` -> None (the job set's t_up / t_down); ``measured`` -> the shipped file; else a costs file."""
    if spec == BFTRAINER:
        return None
    return load_costs(SHIPPED if spec == MEASURED else spec)


class SaveBooks:
    """A replay's books under a measured model, kept as the runtime's checkpoint policy keeps them: node-seconds
    trained and losses without notice (Young's M, over all jobs), and the work the periodic saves cost."""

    def __init__(self, model: CostModel, cause: Cause) -> None:
        self.model, self.cause = model, cause
        self.exposure_node_s = 0.0
        self.losses = 0.0               # expected losses without notice (a share of each reclaim)
        self.stall_loss = 0.0           # samples not trained while periodic saves paused the jobs

    def interval(self, model: str, nodes: int) -> float:
        """Seconds between periodic saves of a job of ``model`` on ``nodes`` nodes."""
        return young_interval(self.model.row(model).save_s, mtbf_node_s(self.exposure_node_s, self.losses,
                                                                        PRIOR_MTBF_NODE_S), nodes)

    def trained(self, model: str, nodes: int, dt: float, samples: float) -> float:
        """``samples`` trained in ``dt`` s on ``nodes`` nodes, less the periodic saves' stalls (returned)."""
        if not nodes or dt <= 0:
            return samples
        self.exposure_node_s += nodes * dt
        lost = samples * min(1.0, self.model.row(model).stall_s / self.interval(model, nodes))
        self.stall_loss += lost
        return samples - lost

    def reclaimed(self, model: str, nodes: int, rate: float) -> float:
        """A reclaim hit a job of ``model`` on ``nodes`` nodes training ``rate`` samples/s: the samples it loses
        beyond the restart already charged (expected over notice or none: half an interval of work, less the
        save a reclaim without notice does not make)."""
        row = self.model.row(model)
        miss = 1.0 - row.notice[self.cause]
        if miss <= 0 or not nodes:
            return 0.0
        lost = miss * rate * max(0.0, self.interval(model, nodes) / 2 - row.save_s)   # the interval it ran with
        self.losses += miss
        return lost


def reclaim_cause(predict: object) -> Cause:
    """The cause the replay gives its reclaims: a reservation when the planner is told hole ends, else a
    preemption."""
    return Cause.RESERVATION if getattr(predict, "name", predict) in ("easy", "clairvoyant") else Cause.PREEMPTION
