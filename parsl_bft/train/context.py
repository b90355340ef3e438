"""A scientist's own training loop, run as fragments: the function-style entry point (like torchrun / Ray Train).

The loop is an ordinary PyTorch loop plus a few calls on the context it receives (one per rank)::

    def train(ctx):
        model = Net().to(ctx.device)
        opt = torch.optim.SGD(model.parameters(), lr=ctx.args.get("lr", 0.1))
        if ctx.restored is not None:                      # what the last ctx.save() was given
            model.load_state_dict(ctx.restored["model"])
            opt.load_state_dict(ctx.restored["optimizer"])
        net = ctx.distributed(model)                      # DDP across the fragment's ranks (when there are several)
        for idx in ctx.batches(len(data)):                # this rank's share of the next GLOBAL batch
            x, y = collate([data[int(i)] for i in idx])
            loss = F.cross_entropy(net(x.to(ctx.device)), y.to(ctx.device))
            opt.zero_grad(); loss.backward(); opt.step()
            ctx.report(loss=loss.item())
            if ctx.should_stop():                         # every rank, once per step: notice, deadline, budget
                break
            if ctx.should_save():                         # periodic saves (a loss without notice costs <= one)
                ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})
        ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})

    TrainingJob("mine", loop="my_script.py:train", samples=100_000, global_batch=64)

The guarantees stay the tool's: ``ctx.batches`` keeps the global batch constant whatever the number of ranks
(rank r takes every world-th sample of a seeded per-epoch permutation) and continues exactly where the last
save stood; the RNG state is saved with every ``ctx.save`` and restored at the first batch; ``should_stop``
agrees on every rank (one small all-reduce) so all ranks leave at the same step. Each ``should_stop`` call
counts one step of ``global_batch`` samples towards the job's budget. A function that returns without being
told to stop has finished the job (its own end, e.g. a fixed number of epochs).
"""
from __future__ import annotations

import inspect
import math
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from .checkpoint import TrainingState, capture_rng, finite_weights, restore_rng
from .config import FragmentConfig, FragmentFailed, FragmentResult, StopReason
from .fragment import _local_rank, close_rank, join_group, open_rank, step_flags
from .protocol import Progress
from .workloads import load_attr


class TrainContext:
    """What a user's training function receives: who it is, where it stands, and the calls that keep the
    fragment's guarantees."""

    def __init__(self, cfg: FragmentConfig, rs, restored: TrainingState | None):
        self._cfg, self._rs = cfg, rs
        self.rank, self.world_size, self.device = rs.rank, rs.world, rs.device
        self.local_rank = _local_rank(rs.rank)           # the launcher's, as the device is chosen by
        self.job, self.global_batch, self.seed = cfg.job, cfg.global_batch, cfg.seed
        self.args: dict[str, Any] = dict(cfg.workload_args)
        self.restored: dict | None = restored.model if restored is not None else None
        st = restored or TrainingState(model={})
        self.step, self.epoch, self.samples_done, self._pos = st.step, st.epoch, st.samples_done, st.data_position
        self.metrics: list[dict] = list(st.metrics)
        self._rng = st.rng
        self.start_step, self.start_samples = self.step, self.samples_done
        self.saved_step, self._saved_at = self.step, time.time()
        rs.saver.durable = (self.saved_step, self._saved_at)    # on disk at the start: what was restored
        self.saves, self.save_s, self.last_save_s = 0, 0.0, 0.0
        self.checkpoint = rs.store.latest_path if restored is not None else None   # the newest, as it goes
        self.stopped_by: StopReason | None = None
        self._last: dict[str, float] = {}
        self._reported = 0.0
        self._net = None

    def distributed(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` wrapped for data parallelism across the fragment's ranks (itself on one rank). DDP averages
        gradients over ranks: with a loss that is the mean over the rank's share, the step is the one of a mean
        over the global batch (exactly when global_batch divides by the number of ranks)."""
        if self.world_size == 1:
            return model
        self._net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[self.device] if self._rs.use_cuda else None, broadcast_buffers=False)
        return self._net

    def batches(self, n: int) -> Iterator[torch.Tensor]:
        """Indices (a LongTensor) of this rank's share of each next global batch from a dataset of ``n`` items:
        epoch after epoch, from where the job stands; the remainder of an epoch is dropped."""
        if n < self.global_batch:
            raise ValueError(f"job {self.job}: a dataset of {n} items cannot fill a global batch of "
                             f"{self.global_batch}")
        if self._rng:                            # the first batch of a resumed fragment: randomness continues
            restore_rng(self._rng)
            self._rng = None
        B = self.global_batch
        while self.stopped_by is None:
            if self._pos + B > n:
                self.epoch, self._pos = self.epoch + 1, 0
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
            while self.stopped_by is None and self._pos + B <= n:
                idx = perm[self._pos: self._pos + B][self.rank::self.world_size]
                self._pos += B                   # where the job stands once this step is done
                step = self.step
                yield idx
                if self.step == step and self.stopped_by is None:   # else no notice ever stops it: it runs on
                    raise FragmentFailed(f"job {self.job}: the training function took the next batch without "
                                         "calling ctx.should_stop() after the last one: call it once per step "
                                         "(it counts the step and ends the fragment when the nodes are reclaimed)")

    def report(self, **metrics: float) -> None:
        """This step's metrics (rank 0's are kept with the checkpoint; ``loss`` also shows as live progress)."""
        self._last = {k: float(v) for k, v in metrics.items()}

    def should_stop(self) -> bool:
        """Call once per step on every rank, after the optimizer step: counts the step and says, the same on
        every rank, whether the fragment must end now (its nodes are reclaimed, its time is up, the job's
        samples are done). Then save and return."""
        cfg = self._cfg
        self.step += 1
        self.samples_done += cfg.global_batch
        loss, stop, late = step_flags(cfg, self._rs, self._last.get("loss", 0.0))
        if "loss" in self._last and not math.isfinite(loss):
            raise FragmentFailed(f"job {cfg.job}: the loss is {loss} at step {self.step}: not saving (the last "
                                 "finite checkpoint stays)")
        loss /= self.world_size
        self.metrics.append({**self._last, "step": self.step, "loss": loss, "world": self.world_size})
        if stop or late:
            self.stopped_by = StopReason.SIGNAL if stop else StopReason.DEADLINE
        elif cfg.total_samples is not None and self.samples_done >= cfg.total_samples:
            self.stopped_by = StopReason.DONE
        elif cfg.steps is not None and self.step - self.start_step >= cfg.steps:
            self.stopped_by = StopReason.STEPS
        if self.rank == 0 and time.perf_counter() - self._reported > 0.5:     # live progress
            self._reported = time.perf_counter()
            self._progress(loss)
        return self.stopped_by is not None

    def should_save(self) -> bool:
        """True on rank 0 when a periodic checkpoint is due (the orchestrator sets the interval from how long
        the nodes are likely to stay)."""
        every = self._cfg.checkpoint_every_s
        return (self.rank == 0 and every is not None and self.step > self.saved_step
                and time.time() - self._saved_at >= every)

    def save(self, state: dict[str, Any]) -> None:
        """Checkpoint ``state`` (any nest of dicts, lists, tensors, numbers and strings: state_dicts) with where
        the job stands; rank 0 writes, the other ranks return at once. Saving twice at a step writes once. While
        training goes on (should_stop() has not said stop) the state is copied to memory and written on a
        thread: the pause is the copy (plus the rest of the previous write, if that is still going)."""
        if self.rank != 0 or (self.step == self.saved_step and (self.saves or self.restored is not None)):
            return
        if not isinstance(state, dict):
            raise TypeError(f"ctx.save takes a dict of state (state_dicts, tensors, numbers), not "
                            f"{type(state).__name__}")
        bad = finite_weights(state["model"] if isinstance(state.get("model"), dict) else state)
        if bad is not None:
            raise FragmentFailed(f"job {self.job}: {bad} is not finite at step {self.step}: not saving (the last "
                                 "finite checkpoint stays)")
        t = time.perf_counter()
        ts = TrainingState(model=state, rng=capture_rng(), step=self.step, epoch=self.epoch,
                           samples_done=self.samples_done, data_position=self._pos,
                           job={"name": self.job, "loop": self._cfg.loop, "global_batch": self.global_batch},
                           metrics=self.metrics)
        if self.stopped_by is None:
            if not self._rs.saver.periodic(ts):      # the last write is still going: this one follows it
                self._rs.saver.background.wait()
                self._rs.saver.periodic(ts)
        else:
            self.checkpoint = self._rs.saver.save(ts)
        self.last_save_s = time.perf_counter() - t
        self.saves, self.save_s = self.saves + 1, self.save_s + self.last_save_s
        self.saved_step, self._saved_at = self.step, time.time()
        self._progress(self.metrics[-1]["loss"] if self.metrics else float("nan"))

    def _progress(self, loss: float) -> None:
        self._rs.saver.report(Progress(self.step, self.samples_done, loss, self.world_size, self.saved_step,
                                       self._saved_at, time.time()))


def _check_signature(fn, spec: str) -> None:
    """Before a rank is set up: a training function is called as fn(ctx)."""
    if not callable(fn):
        raise ValueError(f"training function {spec!r} is a {type(fn).__name__}, not a function: write def train(ctx)")
    try:
        sig = inspect.signature(fn)
    except ValueError:                   # a builtin without a signature: the call itself will say
        return
    try:
        sig.bind(None)
    except TypeError:
        raise ValueError(f"training function {spec!r} takes {sig}; it is called with the context alone: "
                         "write def train(ctx)") from None


def run_loop(cfg: FragmentConfig) -> FragmentResult | None:
    """One rank of a fragment whose training is the user's function ``cfg.loop``. Returns the result on rank 0."""
    rs = open_rank(cfg)
    fn = load_attr(cfg.loop, "training function")
    _check_signature(fn, cfg.loop)
    restored = rs.store.latest()
    ctx = TrainContext(cfg, rs, restored)
    restore_s = time.perf_counter() - rs.t0
    t1 = time.perf_counter()
    join_group(cfg, rs)
    rendezvous_s = time.perf_counter() - t1
    torch.manual_seed(cfg.seed)              # the user's model is built the same way in every fragment
    started, t_train = time.time(), time.perf_counter()
    fn(ctx)
    train_s = time.perf_counter() - t_train
    ctx.stopped_by = ctx.stopped_by or StopReason.FINISHED
    if rs.rank == 0 and ctx.saved_step != ctx.step:
        raise FragmentFailed(f"job {cfg.job}: the training function returned at step {ctx.step} but saved last at "
                             f"step {ctx.saved_step}: call ctx.save(state) before returning")
    if rs.rank == 0:
        written = [c for c in (rs.saver.background.wait(), ctx.checkpoint) if c]   # a save may still be writing
        ctx.checkpoint = max(written, key=lambda c: Path(c).name, default=None)      # ckpt-<step>.h5: the newest
    close_rank(rs, ctx._net)
    if rs.rank != 0:
        return None
    done = ctx.samples_done - ctx.start_samples
    loss = ctx.metrics[-1]["loss"] if ctx.metrics else float("nan")
    res = FragmentResult(cfg.job, rs.world, ctx.start_step, ctx.step, done, ctx.samples_done, train_s, restore_s,
                         rendezvous_s, ctx.last_save_s, done / train_s if train_s > 0 else 0.0, ctx.stopped_by, loss,
                         str(ctx.checkpoint or ""), [str(e) for e in rs.store.skipped], started, ctx.saves,
                         ctx.save_s / ctx.saves if ctx.saves else 0.0)
    if rs.kv is not None:
        rs.kv.set("result", res.to_json())
    return res
