"""``parsl-bft export``: a checkpoint's model as a plain PyTorch file (``torch.save``), for code that knows
nothing of parsl-bft: ``model.load_state_dict(torch.load("model.pt"))``."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .csvio import check_output_path
from .errors import UsageError


def add_export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``export`` subcommand."""
    e = sub.add_parser("export", help="write a checkpoint's model as a plain PyTorch file (torch.save)")
    e.add_argument("checkpoint", help="a checkpoint (ckpt-<step>.h5), or a job's directory (its newest good one)")
    e.add_argument("out", help="the file to write (e.g. model.pt)")
    e.add_argument("--key", help="only this entry of the saved state (a training function that saved "
                   "{'model': ..., 'optimizer': ...}: --key model)")
    e.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    """The model of a checkpoint (a workload job's: its state_dict; a training function's: what it saved, or
    its ``--key`` entry) written with torch.save, its tensors in CPU memory."""
    import torch

    from .train.checkpoint import CheckpointStore, load_checkpoint

    check_output_path(args.out, "out")
    src = Path(args.checkpoint)
    if src.is_dir():
        state = CheckpointStore(src).latest()
        if state is None:
            raise UsageError(f"{src}: no good checkpoint in this directory (give a job's directory, e.g. "
                             "bft-state/NAME/jobs/JOB, or a ckpt-<step>.h5 file)")
    else:
        state = load_checkpoint(src)
    obj: Any = state.model
    if args.key is not None:
        if not isinstance(obj, dict) or args.key not in obj:
            keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise UsageError(f"--key {args.key!r}: the saved state has {keys}")
        obj = obj[args.key]
    torch.save(obj, args.out)
    n = sum(1 for _ in _tensors(obj))
    size = sum(t.numel() * t.element_size() for t in _tensors(obj))
    print(f"wrote {args.out}: {n} tensors, {size / 2**20:.1f} MiB, step {state.step} of job "
          f"{state.job.get('name', '?')}")
    return 0


def _tensors(obj: Any) -> Any:
    import torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
