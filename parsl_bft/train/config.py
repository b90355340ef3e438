"""What crosses the seam between the orchestrator and a fragment: its configuration, its result, why it stopped,
and the error it fails with. Parsl carries the objects themselves (pickled); the launcher's TCPStore and a
site's own launcher (``--config cfg.json``) carry them as JSON (``to_json`` / ``from_json``)."""
from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import BadValue, ParslBftError


class StopReason(StrEnum):
    """Why a fragment stopped. A str: the event log, reports and old comparisons read the plain values."""

    STEPS = "steps"           # its ``steps`` bound
    DEADLINE = "deadline"     # its ``deadline_s``
    SIGNAL = "signal"         # a notice: SIGTERM / SIGUSR1 / SIGINT or the job's STOP file
    DONE = "done"             # the job's ``total_samples`` are trained
    FINISHED = "finished"     # a user's training function returned on its own: the job is complete

    def __str__(self) -> str:
        return self.value


class Precision(StrEnum):
    """The dtype the built-in loop's forward pass and loss run in (autocast); weights and optimizer state stay
    float32. ``fp16`` scales the loss (a GradScaler, its state carried in the checkpoint); ``bf16`` needs none."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    def __str__(self) -> str:
        return self.value


def new_fragment_id(job: str) -> str:
    """A fresh fragment id: the job's name and a random suffix (the one place fragment ids are minted)."""
    return f"{job}-{uuid.uuid4().hex[:10]}"


@dataclass
class FragmentConfig:
    """One fragment of a job: where its checkpoints live, how many ranks, how long it may train."""

    job: str
    workload: str
    checkpoint_dir: str
    world_size: int = 1
    global_batch: int = 64
    micro_batch: int | None = None
    steps: int | None = None
    deadline_s: float | None = None
    total_samples: int | None = None
    seed: int = 0
    workload_args: dict[str, Any] = field(default_factory=dict)
    freeze_layers: int = 0
    keep: int = 3
    backend: str = "auto"             # gloo | nccl | auto (nccl when CUDA is there)
    threads_per_rank: int = 1
    deterministic: bool = True
    timeout_s: float = 60.0           # collective timeout: a dead peer fails the fragment, it does not hang
    fsync: bool = True
    watch_stop: bool = True           # honour the job directory's STOP file (the orchestrator's request)
    generation: str | None = None     # fencing: save only while <checkpoint_dir>/GENERATION still says this
    checkpoint_every_s: float | None = None   # periodic saves (None: only when the fragment stops)
    fragment_id: str = ""             # names this launch in the store, pid and error files ("" = a fresh one)
    ranks_per_node: int = 1           # a gang task starts this many ranks on its node (its accelerators)
    grad_stats_interval: int = 50     # steps per interval of per-layer gradient statistics (train/freezing.py)
    loop: str | None = None           # a user's training function ('file.py:fn'), instead of the workload loop
    precision: Precision = Precision.FP32    # the built-in loop's autocast dtype
    compile: str | None = None        # the built-in loop runs torch.compile(model, backend=compile) ("inductor")
    channels_last: bool = False       # the built-in loop's model and 4-d inputs in channels-last memory format
    sync_batchnorm: bool = False      # BatchNorm statistics over all ranks (SyncBatchNorm, GPU ranks) or per rank
    keep_best: str | None = None      # the metric whose best checkpoint is kept as best.h5 (train/best.py)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise BadValue(f"world_size must be >= 1, got {self.world_size}")
        if self.global_batch < self.world_size:
            raise BadValue(f"global_batch {self.global_batch} < world_size {self.world_size}: every rank needs "
                           "at least one sample per step")
        if self.steps is None and self.deadline_s is None and self.total_samples is None:
            raise BadValue("a fragment needs a bound: steps, deadline_s or total_samples")
        if self.checkpoint_every_s is not None and self.checkpoint_every_s <= 0:
            raise BadValue(f"checkpoint_every_s must be > 0, got {self.checkpoint_every_s}")
        if self.ranks_per_node < 1:
            raise BadValue(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")
        try:
            self.precision = Precision(self.precision)          # from JSON: the plain value
        except ValueError:
            raise BadValue(f"precision must be one of {', '.join(p.value for p in Precision)}, got "
                           f"{str(self.precision)[:40]!r}") from None
        if self.keep_best is not None:
            from .best import BestRule
            BestRule.parse(self.keep_best)
        if self.compile == "":
            raise BadValue("compile names a torch.compile backend (e.g. 'inductor'), or is None")
        if not self.fragment_id:
            self.fragment_id = new_fragment_id(self.job)

    def to_json(self) -> str:
        """The configuration as a JSON object (the rank processes read it back with ``from_json``)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FragmentConfig:
        """A configuration written by ``to_json`` (or by hand: the fields by name)."""
        return cls(**json.loads(text))


@dataclass
class FragmentResult:
    """What rank 0 reports when a fragment ends with a checkpoint."""

    job: str
    world_size: int
    start_step: int
    end_step: int
    samples: int                      # samples trained in this fragment
    samples_done: int                 # job total after it
    train_s: float
    restore_s: float
    rendezvous_s: float
    checkpoint_s: float               # the final save
    throughput: float                 # samples/s while training
    stopped_by: StopReason
    loss: float
    checkpoint: str
    skipped_checkpoints: list[str] = field(default_factory=list)
    train_started: float = 0.0        # unix time the first step began (node joined -> training latency)
    periodic_saves: int = 0
    periodic_save_s: float = 0.0      # mean time of one periodic save (what Young/Daly calls C)
    grad_stats: dict[str, Any] = field(default_factory=dict)   # per-layer gradient statistics (train/freezing.py)

    def __post_init__(self) -> None:
        self.stopped_by = StopReason(self.stopped_by)       # from JSON: the plain value

    @property
    def finished(self) -> bool:
        """The user's training function returned on its own: the job is complete whatever its budget says."""
        return self.stopped_by is StopReason.FINISHED

    def to_json(self) -> str:
        """The result as a JSON object (rank 0 -> the launcher, through the fragment's TCPStore)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FragmentResult:
        """A result written by ``to_json``."""
        return cls(**json.loads(text))


class FragmentFailed(ParslBftError, RuntimeError):
    """A rank died or the fragment could not run; the job resumes from its last good checkpoint."""
