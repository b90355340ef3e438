"""The built-in training loop: a workload's model, data, optimizer and schedule (train/workloads.py) trained as a
``train(ctx)``, against the same TrainContext a scientist's own loop gets, run by the same driver.

Data parallelism keeps the GLOBAL batch constant across world sizes: every step consumes the next
``global_batch`` samples of a seeded per-epoch permutation, rank r takes every world-th of them (in
micro-batches of at most ``micro_batch``, accumulating under DDP's ``no_sync``), DDP sums the per-rank sums of
per-sample gradients (a summing comm hook) and the loss divides by the global batch. So a step is the same
computation on 1 or 8 ranks, up to the order of floating-point additions, and at a fixed world size it is
bit-for-bit reproducible. (A scientist's loop averages instead, DDP's default, with its own mean loss: the two
reductions are each loop's own numbers, and checkpoints of either must go on bit for bit.)

Precision, compilation and memory format are the fragment's (``FragmentConfig.precision``, ``compile``,
``channels_last``): the forward pass and loss run under autocast, fp16 scales the loss with a GradScaler whose
state is saved with the model (a resumed run scales as the uninterrupted one would), and a compiled model saves
and restores the plain model's state_dict (a checkpoint does not care how it was trained).

Beyond a scientist's loop it restores into the built model (``ctx._restore``), layer freezing with its
optimizer state carried across freeze levels, per-layer gradient statistics, the workload's evaluate/log hooks,
and it hands the context its snapshot (``ctx._begin_training``): periodic saves are skipped while the last one
still writes, and the driver writes the final save after the loop.
"""
# no ``from __future__ import annotations``: DDP reads _sum_hook's annotations and wants the real GradBucket
import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket: DDP checks the hook's annotation
from torch.utils.data import Dataset, TensorDataset

from .best import BestRule
from .checkpoint import TrainingState, restore_rng
from .config import FragmentFailed, Precision
from .freezing import GradRecorder, carry_optimizer_state, freeze_prefix
from .workloads import Workload, make_workload

if TYPE_CHECKING:
    from .context import TrainContext


@dataclass
class _Run:
    """What a workload builds for one fragment."""

    wl: Workload
    data: Dataset[Any]
    model: torch.nn.Module
    blocks: list[torch.nn.Module]
    opt: torch.optim.Optimizer
    sched: Any                           # an LR scheduler, or None
    scaler: torch.amp.GradScaler | None  # fp16 only: scales the loss so small gradients survive
    memory_format: torch.memory_format   # of the model and of 4-d inputs


def train(ctx: "TrainContext") -> None:
    """The built-in loop: ``ctx``'s workload built, restored, and trained until the context says stop (its
    bound, a notice, the deadline); the driver writes the final save."""
    cfg = ctx._cfg
    run = _build(ctx)
    state = _restore(ctx, run)
    grads = GradRecorder(run.blocks, cfg.freeze_layers, state.extra.get("grad_stats") if state is not None else None,
                         interval=cfg.grad_stats_interval)
    net = ctx.distributed(run.model)
    if ctx.world_size > 1:
        net.register_comm_hook(None, _sum_hook)     # type: ignore[operator]   # a DistributedDataParallel
    # compiled around DDP (its hooks stay): the forward runs compiled, no_sync and the state are the plain modules'
    fwd = torch.compile(net, backend=cfg.compile) if cfg.compile else net
    ctx._begin_training(snapshot=lambda: _snapshot(ctx, run, grads), grad_stats=grads.report)
    _train_steps(ctx, run, net, fwd, grads)  # type: ignore[arg-type]   # a compiled module is called the same way


def _build(ctx: "TrainContext") -> _Run:
    """The workload's data, model (its first ``freeze_layers`` blocks frozen), optimizer and schedule."""
    cfg = ctx._cfg
    wl = make_workload(cfg.workload, **{"seed": ctx.seed, **ctx.args})
    data = wl.dataset()
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = wl.build_model().to(ctx.device, memory_format=memory_format)  # type: ignore[call-overload]
    blocks = wl.blocks(model)
    try:
        params = freeze_prefix(model, blocks, cfg.freeze_layers)
    except ValueError as e:
        raise FragmentFailed(str(e)) from None
    opt = wl.build_optimizer(params)
    total_steps = -(-cfg.total_samples // cfg.global_batch) if cfg.total_samples else None
    takes = inspect.signature(wl.build_scheduler).parameters       # user subclasses may take fewer arguments
    sched = wl.build_scheduler(opt, **{k: v for k, v in (("total_steps", total_steps),
                                                         ("steps_per_epoch", _len(data) // cfg.global_batch))
                                       if k in takes})
    scaler = torch.amp.GradScaler(ctx.device.type) if cfg.precision is Precision.FP16 else None
    return _Run(wl, data, model, blocks, opt, sched, scaler, memory_format)


def _restore(ctx: "TrainContext", run: _Run) -> TrainingState | None:
    """The job's newest checkpoint in the built model, optimizer (renumbered when written at another freeze
    level), schedule and RNG; a fresh job seeds the RNG instead."""
    # read straight into the built model's tensors (no fresh pages, no second copy; load_state_dict below then
    # copies nothing): the restore reads and verifies the checkpoint and fills the model in one pass
    state = ctx._restore(into=run.model.state_dict())
    if state is None:
        torch.manual_seed(ctx.seed)
        return None
    run.model.load_state_dict(state.model)
    if state.optimizer is not None:
        run.opt.load_state_dict(carry_optimizer_state(state.optimizer, run.model, run.blocks,
                                                      state.extra.get("freeze_layers", 0), run.opt,
                                                      run.wl.build_optimizer))
    if run.sched is not None and state.scheduler is not None:
        run.sched.load_state_dict(state.scheduler)
    if run.scaler is not None and "grad_scaler" in state.extra:     # written at fp16 (none: a fresh scale)
        run.scaler.load_state_dict(state.extra["grad_scaler"])
    if state.rng:
        restore_rng(state.rng)
    return state


def _train_steps(ctx: "TrainContext", run: _Run, net: torch.nn.Module, fwd: torch.nn.Module,
                 grads: GradRecorder) -> None:
    """Step after step until the context stops it; evaluation and logging on rank 0, and its periodic saves."""
    cfg, wl = ctx._cfg, run.wl
    micro = cfg.micro_batch or -(-ctx.global_batch // ctx.world_size)
    best = BestRule.parse(cfg.keep_best).metric if cfg.keep_best else None
    for idx in ctx._batches(_len(run.data)):
        run.opt.zero_grad(set_to_none=False)
        loss_sum = _backward(ctx, run, net, fwd, idx, micro)
        if run.scaler is not None:
            run.scaler.unscale_(run.opt)             # the statistics and the step see the true gradients
        if ctx.rank == 0:
            grads.record(ctx.step)
        if run.scaler is not None:
            run.scaler.step(run.opt)                 # skipped when a gradient overflowed; the scale then shrinks
            run.scaler.update()
        else:
            run.opt.step()
        if run.sched is not None:
            run.sched.step()
        stop_now = ctx._step_done(loss_sum)
        if ctx.rank == 0:
            if wl.eval_every and ctx.step % wl.eval_every == 0:
                ctx.metrics[-1].update(_evaluate(wl, run.model))
            wl.log(ctx.metrics[-1])
        if stop_now:
            break
        if ctx.rank == 0:
            ctx._save_if_due(now=best is not None and best in ctx.metrics[-1])


def _backward(ctx: "TrainContext", run: _Run, net: torch.nn.Module, fwd: torch.nn.Module, idx: torch.Tensor,
              micro: int) -> float:
    """This rank's share of a step in micro-batches, gradients accumulated (synchronised at the last one only);
    returns the rank's loss: its per-sample losses summed and divided by the GLOBAL batch."""
    data, wl, B = run.data, run.wl, ctx.global_batch
    precision = ctx._cfg.precision
    dtype = torch.bfloat16 if precision is Precision.BF16 else torch.float16
    fast = isinstance(data, TensorDataset)     # tensors indexed by a tensor of indices; others item by item
    loss_sum = 0.0
    chunks = list(range(0, len(idx), micro))
    for i, c in enumerate(chunks):
        chunk = idx[c: c + micro]
        batch = _to(ctx.device, data[chunk] if fast else wl.collate([data[int(j)] for j in chunk]),
                    run.memory_format)
        last_micro = i == len(chunks) - 1
        with net.no_sync() if ctx.world_size > 1 and not last_micro else nullcontext():  # type: ignore[operator]
            with torch.autocast(ctx.device.type, dtype=dtype, enabled=precision is not Precision.FP32):
                loss = wl.loss(fwd, batch) * (len(chunk) / B)   # sum of per-sample losses / global batch
            (run.scaler.scale(loss) if run.scaler is not None else loss).backward()  # type: ignore[no-untyped-call]
        loss_sum += float(loss.detach())
    return loss_sum


def _snapshot(ctx: "TrainContext", run: _Run, grads: GradRecorder) -> TrainingState:
    cfg = ctx._cfg
    job = {"name": cfg.job, "workload": cfg.workload, "global_batch": cfg.global_batch}
    extra = {"freeze_layers": cfg.freeze_layers, "grad_stats": grads.state(),
             **({"grad_scaler": run.scaler.state_dict()} if run.scaler is not None else {})}
    return ctx._state(run.model.state_dict(), job, optimizer=run.opt.state_dict(),
                      scheduler=run.sched.state_dict() if run.sched is not None else None, extra=extra)


def _sum_hook(state: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP averages gradients; the loss is already divided by the GLOBAL batch, so sum instead."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    fut: torch.futures.Future[torch.Tensor] = work.get_future().then(lambda f: f.value()[0])
    return fut


def _evaluate(wl: Workload, model: torch.nn.Module) -> dict[str, float]:
    """The workload's held-out metrics, in eval mode without gradients; every module's mode restored after (a
    frozen prefix stays in eval mode)."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            return {k: float(v) for k, v in (wl.evaluate(model) or {}).items()}
    finally:
        for m, training in modes.items():
            m.training = training


def _to(device: torch.device, batch: Any, memory_format: torch.memory_format = torch.contiguous_format) -> Any:
    """A collated batch (tensors, possibly in tuples, lists or dicts) on ``device``; 4-d tensors (images) in
    ``memory_format``."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and memory_format is not torch.contiguous_format:
            return batch.to(device, memory_format=memory_format)
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(device, v, memory_format) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(device, v, memory_format) for v in batch)
    return batch


def _len(data: Dataset[Any]) -> int:
    return len(data)  # type: ignore[arg-type]   # a map-style data set (a workload's) has a length
