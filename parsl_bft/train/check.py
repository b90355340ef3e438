"""Submit-time checks of a job's code: the workload or training function imported, named and built as a rank
would, so that a misspelled file, class, function, ``workload_args`` key or schedule fails at submit in one
line, not in every rank after the workers start. Nothing here trains or reads data (``dataset()`` is not
called)."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .workloads import Workload, WorkloadError, attr_of, load_attr, lr_schedule, workload_factory


def check_loop(spec: str) -> None:
    """The training function ``spec`` names: its file imported (the workflow itself when it is the running
    ``__main__``: not run a second time), the function found, called as ``fn(ctx)``."""
    what = "training function"
    main = _running_main(spec)
    check_signature(attr_of(main, spec, what) if main is not None else load_attr(spec, what), spec)


def _running_main(spec: str) -> ModuleType | None:
    """The running ``__main__`` when ``spec`` names its file (a workflow naming its own ``train``), else None."""
    mod = spec.rpartition(":")[0]
    main = sys.modules.get("__main__")
    where = getattr(main, "__file__", None)
    if main is None or not mod.endswith(".py") or not where or Path(where).resolve() != Path(mod).resolve():
        return None
    return main


def check_signature(fn: object, spec: str) -> None:
    """Before a rank is set up: a training function is called as fn(ctx)."""
    if not callable(fn):
        raise WorkloadError(f"training function {spec!r} is a {type(fn).__name__}, not a function: write "
                            "def train(ctx)")
    try:
        sig = inspect.signature(fn)
    except ValueError:                   # a builtin without a signature: the call itself will say
        return
    try:
        sig.bind(None)
    except TypeError:
        raise WorkloadError(f"training function {spec!r} takes {sig}; it is called with the context alone: "
                            "write def train(ctx)") from None


def check_workload(spec: str, args: dict[str, Any], total_steps: int | None) -> None:
    """The workload ``spec`` names, built with ``args`` as a rank builds it (unknown arguments refused by name),
    and its learning-rate schedule made for a run of ``total_steps``."""
    factory = workload_factory(spec)
    try:
        wl = factory(**{"seed": 0, **args})
    except WorkloadError:
        raise
    except Exception as e:      # the user's constructor: a factory's TypeError names the argument
        raise WorkloadError(f"workload {spec!r} with workload_args {_short(args)}: {type(e).__name__}: {e}") from None
    if not all(callable(getattr(wl, m, None)) for m in ("build_model", "dataset", "loss")):
        raise WorkloadError(f"workload {spec!r} built a {type(wl).__name__}, not a Workload (build_model, dataset, "
                            "loss...): subclass parsl_bft.train.workloads.Workload")
    if isinstance(wl, Workload) and (wl.schedule or wl.warmup):
        check_schedule(wl.schedule, wl.warmup, total_steps)


def check_schedule(schedule: str | None, warmup: float | str, total_steps: int | None) -> None:
    """``lr_schedule``'s own checks, on a stand-in optimizer (the data set's length, which schedules in epochs
    need, is not read here: an epoch counts one step)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    try:
        lr_schedule(opt, schedule, total_steps, warmup, steps_per_epoch=1)
    except (ValueError, TypeError) as e:
        raise WorkloadError(str(e)) from None


def _short(args: dict[str, Any]) -> str:
    text = repr(args)
    return text if len(text) <= 120 else text[:117] + "..."
