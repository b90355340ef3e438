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

``run_loop`` is the one loop driver: the built-in workload loop (``workload_loop.train``) is such a function
too. Members with a leading underscore are the hooks it uses (it restores into its built model, times its own
rendezvous, hands the context its snapshot and leaves the final save to the driver); they are not the
scientist's API.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import BadValue
from .check import check_signature
from .checkpoint import TrainingState, capture_rng, finite_weights, restore_rng
from .config import FragmentConfig, FragmentFailed, FragmentResult, StopReason
from .metrics import FILENAME as METRICS_FILE
from .metrics import MetricsLog
from .protocol import Progress
from .rank import RankSetup, close_rank, fault_point, join_group, local_rank, open_rank, step_flags
from .workloads import WorkloadError, load_attr

TrainFn = Callable[["TrainContext"], object]
"""A training function: called once per rank with its context (``def train(ctx)``)."""
PREFETCH_BATCHES = 32       # batches a loop may take ahead of its steps (a DataLoader's workers prefetch)
# steps whose metrics a checkpoint keeps: the whole history made every save grow with the job (54 MB and a 3.3 s
# save at a million steps of a tiny model); in memory at most twice as many
METRICS_KEPT = 10_000


class TrainContext:
    """What a user's training function receives: who it is, where it stands, and the calls that keep the
    fragment's guarantees."""

    step: int                            # steps the job has done (counted by should_stop): 0 while the first
                                         # trains; metrics are recorded under the count a step ends with
    epoch: int
    samples_done: int
    metrics: list[dict[str, float]]      # one entry per step (the last METRICS_KEPT or more): what ctx.report()
                                         # got, the step's loss, world
    start_step: int                      # where this fragment started
    start_samples: int
    saved_step: int                      # the step of the newest save (the restored one before any)
    _metrics_written: int                # metrics entries on the job's metrics.csv (or restored) so far

    def __init__(self, cfg: FragmentConfig, rs: RankSetup, restored: TrainingState | None = None) -> None:
        self._cfg, self._rs = cfg, rs
        self.rank, self.world_size, self.device = rs.rank, rs.world, rs.device
        self.local_rank = local_rank(rs.rank)            # the launcher's, as the device is chosen by
        self.job, self.global_batch, self.seed = cfg.job, cfg.global_batch, cfg.seed
        self.args: dict[str, Any] = dict(cfg.workload_args)
        self.restored: dict[str, Any] | None = restored.model if restored is not None else None
        self._rng = restored.rng if restored is not None else None
        self._n: int | None = None           # the size of the data set ctx.batches() walks, once it is asked
        self._metrics_log = MetricsLog(rs.jd.path / METRICS_FILE) if rs.rank == 0 else None
        self._position(restored)
        self._start_save_clock()
        self.saves, self.save_s, self.last_save_s = 0, 0.0, 0.0
        self.checkpoint: str | Path | None = rs.store.latest_path if restored is not None else None
        self.stopped_by: StopReason | None = None
        self._last: dict[str, float] = {}
        self._reported = 0.0
        self._net: torch.nn.Module | None = None
        self._joined = False
        self._t_join = self._restore_s = self._rendezvous_s = 0.0
        self._t_train, self._train_started = time.perf_counter(), time.time()
        self._loss = float("nan")                        # the last step's all-reduced loss
        self._snapshot: Callable[[], TrainingState] | None = None          # a loop's own (the built-in's)
        self._grad_stats: Callable[[], dict[str, Any]] = dict

    def distributed(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` wrapped for data parallelism across the fragment's ranks (itself on one rank). DDP averages
        gradients over ranks: with a loss that is the mean over the rank's share, the step is the one of a mean
        over the global batch (exactly when global_batch divides by the number of ranks).

        Buffers (BatchNorm's running statistics) are each rank's own while it trains, not broadcast from rank 0
        at every forward (a collective per step); a checkpoint keeps rank 0's, and every rank of the next fragment
        starts from them. With the job's ``batch_norm="sync"`` its BatchNorm layers are replaced, in place, by
        SyncBatchNorm: batch statistics over the global batch (GPU ranks only)."""
        self._join()
        if self.world_size == 1:
            return model
        if self._cfg.sync_batchnorm:
            if not self._rs.use_cuda:
                raise WorkloadError(f"job {self.job}: batch_norm='sync' needs GPU ranks (torch's SyncBatchNorm); "
                                    "these ranks run on CPUs: use batch_norm='per-rank'")
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
        # forward_sync_buffers=False: per-rank buffers, as broadcast_buffers=False (deprecated: a FutureWarning in
        # every rank's log) gave; buffers are equal at the start anyway (every rank restored the same checkpoint)
        self._net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[self.device] if self._rs.use_cuda else None, forward_sync_buffers=False)
        return self._net

    def batches(self, n: int) -> Iterator[torch.Tensor]:
        """Indices (a LongTensor) of this rank's share of each next global batch from a dataset of ``n`` items:
        epoch after epoch, from where the job stands; the remainder of an epoch is dropped."""
        if n < self.global_batch:
            raise BadValue(f"job {self.job}: a dataset of {n} items cannot fill a global batch of "
                           f"{self.global_batch}")
        return self._batches(n)

    def report(self, **metrics: float) -> None:
        """This step's metrics (rank 0's are kept with the checkpoint; ``loss`` also shows as live progress)."""
        self._last = {k: float(v) for k, v in metrics.items()}

    def should_stop(self) -> bool:
        """Call once per step on every rank, after the optimizer step: counts the step and says, the same on
        every rank, whether the fragment must end now (its nodes are reclaimed, its time is up, the job's
        samples are done). Then save and return."""
        loss, stop, late = self._count_step(self._last.get("loss", 0.0), check="loss" in self._last)
        loss /= self.world_size                 # the ranks' own means, averaged
        self._keep_metrics({**self._last, "step": self.step, "loss": loss, "world": self.world_size})
        self._decide(stop, late)
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
        if self.rank != 0 or (self.step == self.saved_step and (self.saves or self.checkpoint is not None)):
            return
        if not isinstance(state, dict):
            raise TypeError(f"ctx.save takes a dict of state (state_dicts, tensors, numbers), not "
                            f"{type(state).__name__}")
        bad = finite_weights(state)          # the whole state: a model may be under any key
        if bad is not None:
            raise FragmentFailed(f"job {self.job}: {bad} is not finite at step {self.step}: not saving (the last "
                                 "finite checkpoint stays)")
        t = time.perf_counter()
        ts = self._state(state, {"name": self.job, "loop": self._cfg.loop, "global_batch": self.global_batch})
        saver = self._rs.saver
        if self.stopped_by is None:
            if not saver.periodic(ts):           # the last write is still going: this one follows it
                saver.background.wait()
                saver.periodic(ts)
        else:
            self.checkpoint = saver.save(ts, notice=self._may_hand_over())
        self.last_save_s = time.perf_counter() - t
        self.saves, self.save_s = self.saves + 1, self.save_s + self.last_save_s
        self.saved_step, self._saved_at = self.step, time.time()
        self._progress(self.metrics[-1]["loss"] if self.metrics else float("nan"))

    def _may_hand_over(self) -> bool:
        """Stopped by a request that lets the final save hand over the newest periodic checkpoint (a resize or a
        reclaim: ``saver.hand_over`` decides whether it is cheaper)."""
        return self.stopped_by is StopReason.SIGNAL and self._rs.jd.stop_hands_over()

    def _progress(self, loss: float) -> None:
        self._rs.saver.report(Progress(self.step, self.samples_done, loss, self.world_size, self.saved_step,
                                       self._saved_at, time.time()))
        self._flush_metrics()

    def _flush_metrics(self) -> None:
        """Rank 0: the steps recorded since the last flush, onto the job's metrics.csv; the fragment's first flush
        trims the file to the step it started from. A file that cannot be written is said once, not fatal."""
        log = self._metrics_log
        if log is None:
            return
        try:
            if not log.resumed:
                log.resume(self.start_step, self.metrics[: self._metrics_written])
            log.append(self.metrics[self._metrics_written:])
        except OSError as e:
            print(f"parsl-bft: job {self.job}: not writing {log.path}: {e}", file=sys.stderr, flush=True)
            self._metrics_log = None
        self._metrics_written = len(self.metrics)

    # the driver's hooks, and the built-in loop's (workload_loop.py) --------------------------------------------

    def _position(self, st: TrainingState | None) -> None:
        """Where the job stands: at ``st`` (the checkpoint restored), else at its start."""
        st = st or TrainingState(model={})
        self.step, self.epoch, self.samples_done, self._pos = st.step, st.epoch, st.samples_done, st.data_position
        self.metrics = list(st.metrics)
        self.start_step, self.start_samples = self.step, self.samples_done
        self._metrics_written = len(self.metrics)        # rows before it are the checkpoint's history
        if self._metrics_log is not None:
            self._metrics_log.resumed = False

    def _start_save_clock(self) -> None:
        """Periodic saves count from now; on disk now: what was restored."""
        self.saved_step, self._saved_at = self.step, time.time()
        self._rs.saver.durable = (self.saved_step, self._saved_at)

    def _restore(self, into: Mapping[str, torch.Tensor]) -> TrainingState | None:
        """The newest good checkpoint, read straight into ``into`` (the built model's tensors: no second copy),
        and the job positioned at it; for a loop that restores its state itself (a scientist's gets
        ``restored``). On an accelerator its large tensors are read onto the rank's device."""
        st = self._rs.store.latest(into=into, device=self._rs.device if self._rs.use_cuda else None)
        self._position(st)
        return st

    def _join(self) -> None:
        """The fragment's process group, once: the time before it counts as the restore, its own as the
        rendezvous."""
        if self._joined:
            return
        self._t_join = time.perf_counter()
        self._restore_s = self._t_join - self._rs.t0
        join_group(self._cfg, self._rs)
        self._joined = True
        self._rendezvous_s = time.perf_counter() - self._t_join

    def _begin_training(self, snapshot: Callable[[], TrainingState] | None = None,
                        grad_stats: Callable[[], dict[str, Any]] | None = None) -> None:
        """Training starts now (the train timer, the result's train_started). A loop that keeps its own state
        (the built-in) hands over ``snapshot`` (its TrainingState now: for its periodic saves and the final one,
        which the driver writes) and ``grad_stats``; its rendezvous counts until now (the DDP wrapper too), its
        save clock starts now, and its bound is checked before the first step as before every other."""
        if snapshot is not None:
            self._snapshot, self._grad_stats = snapshot, grad_stats or dict
            self._rendezvous_s = time.perf_counter() - self._t_join
            self._start_save_clock()
            self._decide(stop=False, late=False)
        self._t_train, self._train_started = time.perf_counter(), time.time()

    def _batches(self, n: int) -> Iterator[torch.Tensor]:
        """``batches`` without its size check: a data set smaller than the global batch gives each step all of a
        fresh epoch (the built-in loop has always trained so). The job's data position moves with the steps
        counted (``_count_step``), not with the batches taken: a DataLoader over these batches prefetches a few
        ahead, and a resume must start after the last batch trained, not the last one fetched."""
        if self._rng:                            # the first batch of a resumed fragment: randomness continues
            restore_rng(self._rng)
            self._rng = None
        B, self._n = self.global_batch, n
        epoch, pos, start, taken = self.epoch, self._pos, self.step, 0
        perm = self._permutation(n, epoch)
        while self.stopped_by is None:
            if taken - (self.step - start) > PREFETCH_BATCHES:       # else no notice ever stops it: it runs on
                raise FragmentFailed(f"job {self.job}: the training function took {taken} batches in "
                                     f"{self.step - start} steps without calling ctx.should_stop() once a step "
                                     "(it counts the step and ends the fragment when the nodes are reclaimed)")
            if pos + B > n:                      # next epoch: a fresh permutation, the remainder is dropped
                epoch, pos = epoch + 1, 0
                perm = self._permutation(n, epoch)
            idx = perm[pos: pos + B][self.rank::self.world_size]
            pos, taken = pos + B, taken + 1
            yield idx

    def _permutation(self, n: int, epoch: int) -> torch.Tensor:
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))

    def _advance_position(self) -> None:
        """A step trained the next global batch: the job's data position follows (as ``_batches`` took it)."""
        if self._n is not None:
            if self._pos + self.global_batch > self._n:
                self.epoch, self._pos = self.epoch + 1, 0
            self._pos += self.global_batch

    def _count_step(self, loss: float, *, check: bool) -> tuple[float, bool, bool]:
        """A step is done on this rank: count it, then agree with every rank on the loss (all-reduced) and on
        stopping. A non-finite loss (``check``) fails the fragment on every rank at the same step."""
        self._join()
        self.step += 1
        self.samples_done += self.global_batch
        self._advance_position()
        fault_point(self.rank, self.step)
        loss, stop, late = step_flags(self._cfg, self._rs, loss)
        if check and not math.isfinite(loss):
            raise FragmentFailed(f"job {self.job}: the loss is {loss} at step {self.step}: not saving (the last "
                                 "finite checkpoint stays)")
        return loss, stop, late

    def _keep_metrics(self, entry: dict[str, float]) -> None:
        """A step's metrics; the oldest go once there are twice METRICS_KEPT (so trimming costs O(1) a step)."""
        self.metrics.append(entry)
        if len(self.metrics) > 2 * METRICS_KEPT:
            del self.metrics[:-METRICS_KEPT]

    def _decide(self, stop: bool, late: bool) -> None:
        """Why the fragment ends, if it does: a notice, the deadline, the job's samples done, its step bound."""
        cfg = self._cfg
        if stop or late:
            self.stopped_by = StopReason.SIGNAL if stop else StopReason.DEADLINE
        elif cfg.total_samples is not None and self.samples_done >= cfg.total_samples:
            self.stopped_by = StopReason.DONE
        elif cfg.steps is not None and self.step - self.start_step >= cfg.steps:
            self.stopped_by = StopReason.STEPS

    def _step_done(self, loss_sum: float) -> bool:
        """The built-in loop's end of a step, on every rank. Its loss is already divided by the global batch,
        so the ranks' losses are summed, not averaged. True: a notice or the deadline ends the fragment now
        (the job's bound ends it at the next batch, after this step's periodic save)."""
        loss, stop, late = self._count_step(loss_sum, check=True)
        self._loss = loss
        self._keep_metrics({"step": self.step, "loss": loss, "world": self.world_size})
        self._decide(stop, late)
        return stop or late

    def _save_if_due(self, now: bool = False) -> None:
        """The built-in loop's periodic save (skipped while the last one still writes) and live progress, on
        rank 0 after a step it goes on from; before the first save, the copy buffers are made ready. ``now``: a
        save at this step whatever the interval (a candidate for the best checkpoint: its metric was measured)."""
        assert self._snapshot is not None
        every = self._cfg.checkpoint_every_s
        if self.should_save() or (now and self.step > self.saved_step):
            t = time.perf_counter()
            if now:
                self._rs.saver.background.wait()               # not skipped for a write still going
            if self._rs.saver.periodic(self._snapshot()):      # the pause is a memory copy; a thread writes
                self.saves, self.save_s = self.saves + 1, self.save_s + time.perf_counter() - t
                self.saved_step, self._saved_at = self.step, time.time()
                self._reported = 0.0
        elif every is not None and self.step == self.start_step + 1:
            self._rs.saver.background.prepare(self._snapshot())
        if time.perf_counter() - self._reported > 0.5:      # live progress for the orchestrator
            self._reported = time.perf_counter()
            self._progress(self._loss)

    def _state(self, model: dict[str, Any], job: dict[str, Any], **parts: Any) -> TrainingState:
        """A checkpoint of ``model`` (and optimizer, scheduler, extra ``parts``) with where the job stands."""
        return TrainingState(model=model, rng=capture_rng(), step=self.step, epoch=self.epoch,
                             samples_done=self.samples_done, data_position=self._pos, job=job,
                             metrics=self.metrics[-METRICS_KEPT:],
                             **parts)


def run_loop(cfg: FragmentConfig, train: TrainFn | None = None) -> FragmentResult | None:
    """One rank of a fragment, the one loop driver: a training function run against a TrainContext, then the
    final save and (rank 0) the result. ``train``: a loop that keeps its own state (the built-in workload loop);
    None: the user's function ``cfg.loop``, called with its process group formed, the RNG seeded and what its
    last ``ctx.save`` was given in ``ctx.restored``."""
    rs = open_rank(cfg)
    fn, ctx = _user_loop(cfg, rs) if train is None else (train, TrainContext(cfg, rs))
    fn(ctx)
    train_s = time.perf_counter() - ctx._t_train
    if ctx._snapshot is not None:
        checkpoint_s, loss = _final_save(ctx), ctx._loss
    else:
        checkpoint_s, loss = _user_loop_returned(ctx), ctx.metrics[-1]["loss"] if ctx.metrics else float("nan")
    if rs.rank != 0:
        return None
    done = ctx.samples_done - ctx.start_samples
    end_step, samples_done = rs.saver.handed_over or (ctx.step, ctx.samples_done)   # where the job stands now
    res = FragmentResult(ctx.job, rs.world, ctx.start_step, end_step, done, samples_done, train_s,
                         ctx._restore_s, ctx._rendezvous_s, checkpoint_s, done / train_s if train_s > 0 else 0.0,
                         ctx.stopped_by or StopReason.FINISHED, loss, str(ctx.checkpoint or ""),
                         [str(e) for e in rs.store.skipped], ctx._train_started, ctx.saves,
                         ctx.save_s / ctx.saves if ctx.saves else 0.0, ctx._grad_stats())
    if rs.kv is not None:                  # launched: the launcher reads it there
        rs.jd.write_result(cfg.fragment_id, res.to_json())
    return res


def _user_loop(cfg: FragmentConfig, rs: RankSetup) -> tuple[TrainFn, TrainContext]:
    """The user's training function and its context: restored, in its process group, seeded."""
    spec = cfg.loop or ""
    fn = load_attr(spec, "training function")
    check_signature(fn, spec)
    ctx = TrainContext(cfg, rs, rs.store.latest(device=rs.device if rs.use_cuda else None))   # as map_location
    ctx._join()
    torch.manual_seed(cfg.seed)              # the user's model is built the same way in every fragment
    ctx._begin_training()
    return fn, ctx  # type: ignore[return-value]   # check_signature: called as fn(ctx)


def _final_save(ctx: TrainContext) -> float:
    """A loop that handed over its state ended: rank 0 saves it (a periodic save of the same step is not
    written twice; after a resize's stop the newest periodic save may stand for it: ``saver.hand_over``) and
    reports it as its final progress; every rank meets the others once more. Returns the seconds this took."""
    rs, t = ctx._rs, time.perf_counter()
    if rs.rank == 0 and ctx._snapshot is not None:
        ctx.checkpoint = rs.saver.save(ctx._snapshot(), notice=ctx._may_hand_over())
        saved = (rs.saver.handed_over[0], rs.saver.durable[1]) if rs.saver.handed_over and rs.saver.durable \
            else (ctx.step, time.time())
        rs.jd.write_progress(Progress(ctx.step, ctx.samples_done, ctx._loss, ctx.world_size, *saved, time.time()))
        ctx._flush_metrics()
    close_rank(rs, ctx._net)
    return time.perf_counter() - t


def _user_loop_returned(ctx: TrainContext) -> float:
    """The user's function returned: on its own (it finished the job) or told to stop; either way its last
    step must be saved. Returns the seconds of its last save."""
    rs = ctx._rs
    ctx.stopped_by = ctx.stopped_by or StopReason.FINISHED
    if rs.rank == 0 and ctx.saved_step != ctx.step:
        raise FragmentFailed(f"job {ctx.job}: the training function returned at step {ctx.step} but saved last at "
                             f"step {ctx.saved_step}: call ctx.save(state) before returning")
    if rs.rank == 0:
        written = [c for c in (rs.saver.background.wait(), ctx.checkpoint) if c]   # a save may still be writing
        ctx.checkpoint = max(written, key=lambda c: Path(c).name, default=None)      # ckpt-<step>.h5: the newest
        ctx._flush_metrics()
    close_rank(rs, ctx._net)
    return ctx.last_save_s
