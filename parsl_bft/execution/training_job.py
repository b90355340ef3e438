"""What a scientist declares: ``TrainingJob``, and the checks that run before a job is stored or launched."""
from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import BadValue
from ..jobs import FreezeMode, JobSpec, JobSpecError
from ..jobs import check_job_name as check_job_name  # re-exported: its home moved to jobs (no torch there)
from ..train.best import BestRule
from ..train.config import Precision


@dataclass
class TrainingJob:
    """What a scientist declares: a model to train on whatever idle nodes there are."""

    name: str                      #: names its checkpoints' folder and its ``status`` row (letters, digits, ``-_.``)
    workload: str = "images"       #: a built-in workload ("images", "lm", ...) or yours: ``'file.py:MyWorkload'``
    samples: int = 50_000          #: samples to train in all (the job is done when they are)
    min_nodes: int = 1             #: fewest nodes a fragment runs on (the planner gives none or at least these)
    max_nodes: int = 4             #: most nodes a fragment runs on
    global_batch: int = 64         #: samples per optimizer step over all ranks, whatever the node count
    workload_args: dict[str, Any] = field(default_factory=dict)  #: keyword arguments of the workload's constructor
    t_up: float = 10.0             #: seconds of progress a scale-up costs (measure yours: ``parsl-bft profile``)
    t_down: float = 10.0           #: seconds of progress a scale-down costs
    weight: float = 1.0            #: its weight under the planner's "weighted" objective (2.0: it counts twice)
    rate_guess: float = 1000.0     #: samples/s on one node until measured (fragments feed real rates back)
    freeze: FreezeMode = "off"     #: "auto": the planner may freeze a prefix of layers (layer elasticity); "off"
    accuracy_budget: float = 0.0   #: with freeze="auto", the predicted accuracy a freeze may cost (0.005: half a point)
    loop: str | None = None        #: your own training function, ``'file.py:fn'`` (see ``TrainContext``)
    deterministic: bool = True     #: torch deterministic algorithms (bit-for-bit resumes; off: faster kernels)
    precision: str = "fp32"        #: the built-in loop's autocast: "fp32", "bf16" or "fp16" (loss scaled)
    compile: bool | str = False    #: the built-in loop runs torch.compile(model): True (inductor) or a backend
    channels_last: bool = False    #: the built-in loop's model and images in channels-last memory format
    micro_batch: int | None = None  #: samples a rank computes at once (gradients accumulated): when a batch won't fit
    batch_norm: str = "per-rank"   #: BatchNorm statistics: each rank's own ("per-rank") or over all ranks ("sync")
    keep_best: str | None = None   #: a metric: its best checkpoint stays as best.h5 ("val_loss": lowest, "max:acc")

    def __post_init__(self) -> None:
        check_job_name(self.name)
        if self.loop is not None:        # ranks run in other directories: its file by its absolute path
            mod, fn = self._check_spec("loop", self.loop, "'my_script.py:train' or 'package.module:train'")
            self.loop = f"{Path(mod).resolve()}:{fn}" if mod.endswith(".py") else self.loop

    def check_workload(self) -> None:
        """At submit (not when a restart reads the job back): a typo fails here, not later in a rank. Torch is
        imported here, not with this module: a workflow's session has started its workers by now, and they start
        while this process imports it."""
        from ..train.workloads import WORKLOADS

        if self.loop is not None and self.freeze != "off":
            raise BadValue(f"job {self.name!r}: freeze={self.freeze!r} needs a workload (the tool's loop freezes "
                           "its blocks()); your own loop is never frozen: drop freeze, or write a Workload")
        if self.precision not in set(Precision):
            raise BadValue(f"job {self.name!r}: precision must be one of {', '.join(Precision)}, got "
                           f"{str(self.precision)[:40]!r}")
        mb = self.micro_batch
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
            raise BadValue(f"job {self.name!r}: micro_batch must be an integer >= 1 (or None: a rank's whole "
                           f"share of the batch at once), got {str(mb)[:40]!r}")
        if not isinstance(self.compile, (bool, str)) or self.compile == "" or not isinstance(self.channels_last, bool):
            raise BadValue(f"job {self.name!r}: compile is True, False or a torch.compile backend's name, and "
                           "channels_last True or False")
        own = [f for f in ("precision", "compile", "channels_last", "micro_batch")
               if getattr(self, f) not in ("fp32", False, None)]
        if self.loop is not None and own:
            raise BadValue(f"job {self.name!r}: {', '.join(own)} set the built-in loop's; your own loop chooses "
                           "its own (torch.autocast, torch.compile, memory_format in it): drop them")
        if self.batch_norm not in ("per-rank", "sync"):
            raise BadValue(f"job {self.name!r}: batch_norm is 'per-rank' (each rank's own statistics) or 'sync' "
                           f"(SyncBatchNorm over all ranks, on GPUs), got {str(self.batch_norm)[:40]!r}")
        if self.keep_best is not None:
            try:
                BestRule.parse(self.keep_best)
            except BadValue as e:
                raise BadValue(f"job {self.name!r}: {e}") from None
        if not isinstance(self.deterministic, bool):
            raise BadValue(f"job {self.name!r}: deterministic is True or False, got {str(self.deterministic)[:40]!r}")
        if self.loop is None and self.workload not in WORKLOADS:
            self._check_spec("workload", self.workload, f"{' or '.join(map(repr, WORKLOADS))}, "
                             "'package.module:factory' or 'my_model.py:factory'")
        self._check_code()

    def _check_code(self) -> None:
        """The code a rank would run, loaded and built now (a loop's file imported and its function found; a
        workload built with its arguments and its schedule made): its mistake in one line, before any worker."""
        from ..train.check import check_loop, check_workload
        from ..train.workloads import WorkloadError

        total = -(-self.samples // self.global_batch) if _positive_int(self.samples) and \
            _positive_int(self.global_batch) else None
        try:
            if self.loop is not None:
                check_loop(self.loop)
            else:
                check_workload(self.workload, self.workload_args, total)
        except WorkloadError as e:
            field = "loop" if self.loop is not None else "workload"
            raise JobSpecError(field, f"job {self.name!r}: {e}", str(e)) from None

    def _check_spec(self, what: str, spec: str, forms: str) -> tuple[str, str]:
        mod, _, name = str(spec).rpartition(":")
        if not mod or not name:
            raise BadValue(f"job {self.name!r}: {what} {spec!r}: write {forms}")
        if mod.endswith(".py") and not Path(mod).is_file():
            raise BadValue(f"job {self.name!r}: {what} {spec!r}: no such file {mod}")
        return mod, name

    def spec(self) -> JobSpec:
        """The planner's view of this job (sizes, costs, weight), validated with messages that name its fields."""
        for f, kind in (("rate_guess", (int, float)), ("global_batch", int)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, kind) or not 0 < v < math.inf:
                raise BadValue(f"job {self.name!r}: {f} must be {'an integer' if kind is int else 'a number'} "
                               f"> 0, got {v!r}")
        try:
            return JobSpec(self.name, self.name, self.min_nodes, self.max_nodes, self.t_up, self.t_down,
                           float(self.samples), 0.0, self.weight, freeze=self.freeze,
                           accuracy_budget=self.accuracy_budget)
        except JobSpecError as e:       # JobSpec's field names are TrainingJob's: name the one to fix
            raise JobSpecError(e.field, f"job {self.name!r}: {e.field}: {e.problem}", e.problem) from None

    def check_submit(self, ranks_per_node: int) -> None:
        """Everything a new job must pass before it is stored: JSON arguments, a known workload or loop, sizes,
        and at least one sample per rank and step at its largest size."""
        check_json_args(self)
        self.spec()
        self.check_workload()
        if self.global_batch < self.max_nodes * ranks_per_node:
            raise BadValue(f"job {self.name!r}: global_batch {self.global_batch} < max_nodes {self.max_nodes} x "
                           f"{ranks_per_node} ranks per node: every rank needs at least one sample per step")


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_json_args(job: TrainingJob) -> None:
    """workload_args are stored with the job (JSON): name the field that is not, and say what to pass."""
    for k, v in job.workload_args.items():
        try:
            json.dumps(v, allow_nan=False)
        except RecursionError:
            raise BadValue(f"job {job.name!r}: workload_args[{k!r}] is nested too deeply to store (hundreds of "
                           "levels): pass its data as a file path") from None
        except (TypeError, ValueError):
            hint = "str(path)" if isinstance(v, os.PathLike) else "a str, number, bool, list or dict of those"
            raise BadValue(f"job {job.name!r}: workload_args[{k!r}] is a {type(v).__name__}, not a JSON value "
                           f"(they are stored with the job): pass {hint}") from None


def submit_when_ready(job: TrainingJob, inputs: dict[str, Future[Any]],
                      submit: Callable[[TrainingJob], Future[Any]],
                      refused: Callable[[], BaseException | None]) -> Future[Any]:
    """A job whose ``workload_args`` hold futures (``inputs``: a Parsl app preparing the data, another job's
    checkpoint) is submitted once they have all resolved, with their results in place; the returned future
    follows the job's. An upstream failure, a bad spec, or ``refused()`` (the run has stopped) reaches it."""
    out: Future[Any] = Future()
    once = threading.Lock()

    def ready(_: Future[Any]) -> None:
        if not all(f.done() for f in inputs.values()) or not once.acquire(blocking=False):
            return
        err = refused()
        if err is not None:
            out.set_exception(err)
            return
        try:
            args = {k: inputs[k].result() if k in inputs else v for k, v in job.workload_args.items()}
            inner = submit(replace(job, workload_args=args))
        except BaseException as e:  # an upstream failure or a bad spec reaches the job's future
            out.set_exception(e)
            return
        inner.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception()
                                else out.set_result(f.result()))
    for f in inputs.values():
        f.add_done_callback(ready)
    return out


def check_same_spec(stored: TrainingJob, new: TrainingJob, state_dir: Path) -> None:
    """A job submitted again under a stored job's name must be the same job: say what changed and how to start
    afresh."""
    # as stored: through JSON (a tuple in workload_args comes back a list, and is the same job)
    old, now = json.loads(json.dumps(asdict(stored))), json.loads(json.dumps(asdict(new)))
    if old != now:
        changed = ", ".join(f"{k} {old[k]!r} -> {now[k]!r}" for k in now if old.get(k) != now[k])
        raise BadValue(f"job {new.name!r} already exists in {state_dir} with another spec ({changed}): "
                       "give the changed job a new name, use another state directory, or start afresh "
                       "with `parsl-bft run --new-run` (training_session(new_run=True)), which keeps the "
                       "old state aside")
