"""One training fragment: restore -> rendezvous on n ranks -> train (saving periodically) -> checkpoint -> report.

Ranks are started by ``launcher.run_fragment`` (local processes from a preloaded forkserver, as a Parsl app
does) or by a site's own launcher (``srun python -m parsl_bft.train.fragment --config cfg.json``); each rank
reads its rank and world size from the launcher's environment and meets its peers through a torch TCPStore
(``PARSL_BFT_STORE``) or, under srun/mpiexec, through MASTER_ADDR/MASTER_PORT.

Data parallelism keeps the GLOBAL batch constant across world sizes: every step consumes the next
``global_batch`` samples of a seeded per-epoch permutation, rank r takes every world-th of them (in
micro-batches of at most ``micro_batch``, accumulating under DDP's ``no_sync``), DDP sums the per-rank sums of
per-sample gradients (a summing comm hook) and the loss divides by the global batch. So a step is the same
computation on 1 or 8 ranks, up to the order of floating-point additions, and at a fixed world size it is
bit-for-bit reproducible.

Stopping: after ``steps`` steps, at ``deadline_s`` seconds, when the job's ``total_samples`` are done, or on
SIGTERM / SIGUSR1 / the job's STOP file (the reclaim notice; any rank seeing it stops all ranks at the same
step: the flags ride on the per-step loss all-reduce). Then rank 0 writes the checkpoint and the result.
Besides, rank 0 saves every ``checkpoint_every_s`` seconds, so a loss WITHOUT notice (a pilot killed, a node
crash) costs at most that much training.
"""
from __future__ import annotations

import argparse
import inspect
import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from .checkpoint import BackgroundSave, CheckpointStore, TrainingState, capture_rng, finite_weights, restore_rng
from .config import FragmentConfig, FragmentFailed, FragmentResult, StopReason
from .freezing import GradRecorder, carry_optimizer_state, freeze_prefix
from .protocol import JobDir, Progress
from .workloads import make_workload

_STOP = {"flag": False}


def _on_signal(signum, frame):  # noqa: ARG001
    _STOP["flag"] = True


def _rank_env() -> tuple[int, int]:
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("PMI_RANK", "PMI_SIZE"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", "PMIX_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def _local_rank(rank: int) -> int:
    for v in ("LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID"):
        if v in os.environ:
            return int(os.environ[v])
    return rank


def rank_store(timeout_s: float) -> dist.Store | None:
    """The TCPStore client of this fragment (``PARSL_BFT_STORE`` = host:port, keys under the fragment id)."""
    addr = os.environ.get("PARSL_BFT_STORE")
    if not addr:
        return None
    host, port = addr.rsplit(":", 1)
    base = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(os.environ["PARSL_BFT_FRAGMENT"], base)


def _master_addr() -> str:
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodes:
        import subprocess
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    return "127.0.0.1"


_KEEP: list = []        # what must outlive train_rank in a rank process (see the end of train_rank)


def _sum_hook(state, bucket):  # noqa: ARG001
    """DDP averages gradients; the loss is already divided by the GLOBAL batch, so sum instead."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


class _Saver:
    """Rank 0's saves, fenced: a fragment of an older orchestrator life must not write. ``periodic`` saves are a
    memory copy written on a thread while training goes on (a failed one fails the next save); ``save`` (the
    final one, on a notice) waits for that write and skips writing the same step twice."""

    def __init__(self, cfg: FragmentConfig, store: CheckpointStore, jd: JobDir):
        self.cfg, self.store, self.jd = cfg, store, jd
        self.background = BackgroundSave(self._write)
        self._started: tuple[int, float] | None = None   # (step, time) of the state the background writes
        self.durable: tuple[int, float] | None = None    # the same of the last save on disk
        self._lock = threading.Lock()                    # progress is written by the loop and by the writer
        self._progress: Progress | None = None

    def _fenced(self) -> str | None:
        """Why this fragment may no longer write the job's files, or None: a newer orchestrator life owns the job
        (GENERATION), or it runs as a newer fragment (FRAGMENT: this one was given up for lost)."""
        if self.cfg.generation is None:
            return None
        owner = self.jd.owner()
        if owner is not None and owner != self.cfg.generation:
            return f"fragment of {self.cfg.job} is stale (generation {self.cfg.generation}, the job is now at {owner})"
        current = self.jd.current_fragment()
        if current is not None and current != self.cfg.fragment_id:
            return f"fragment {self.cfg.fragment_id} of {self.cfg.job} is stale (the job runs as {current} now)"
        return None

    def report(self, p: Progress) -> None:
        """Live progress; its saved step is the newest save on disk (a background write reports when it lands).
        A fenced-off fragment stops here (within a report interval) instead of training on for nobody."""
        stale = self._fenced()
        if stale:
            raise FragmentFailed(f"{stale}: stopping")
        with self._lock:
            if self.durable is not None:
                p = replace(p, saved_step=self.durable[0], saved_at=self.durable[1])
            self.jd.write_progress(p)
            self._progress = p

    def periodic(self, state: TrainingState) -> bool:
        """Start a background save; False while the last one still writes (try again next step)."""
        if self.background.busy():
            return False
        self._started = (state.step, time.time())       # before the thread can finish and read it
        return self.background.start(state)

    def save(self, state: TrainingState) -> Path:
        last = self.background.wait()
        if last is not None and self.durable is not None and self.durable[0] == state.step:
            return last
        return self._write(state)

    def _write(self, state: TrainingState) -> Path:
        stale = self._fenced()
        if stale:
            raise FragmentFailed(f"{stale}: not saving")
        bad = finite_weights(state.model)
        if bad is not None:
            raise FragmentFailed(f"job {self.cfg.job}: weight {bad} is not finite at step {state.step}: not saving "
                                 "(the last finite checkpoint stays)")
        path = self.store.save(state, fsync=self.cfg.fsync)
        started = self._started
        with self._lock:
            self.durable = started if started is not None and started[0] == state.step else (state.step, time.time())
            if self._progress is not None:
                self._progress = replace(self._progress, saved_step=self.durable[0], saved_at=self.durable[1],
                                         t=time.time())
                self.jd.write_progress(self._progress)
        return path


def _evaluate(wl, model: torch.nn.Module) -> dict[str, float]:
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


def _to(device, batch):
    """A collated batch (tensors, possibly in tuples, lists or dicts) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(device, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(device, v) for v in batch)
    return batch


@dataclass
class RankSetup:
    """What every rank of a fragment has once it started: who it is, its device, its job's files."""

    rank: int
    world: int
    kv: dist.Store | None
    device: torch.device
    use_cuda: bool
    jd: JobDir
    store: CheckpointStore
    saver: _Saver
    t0: float                          # perf_counter at the start (deadline_s counts from here)


def open_rank(cfg: FragmentConfig) -> RankSetup:
    """Signals, the launcher handshake, threads, determinism, the device and the job's checkpoint store."""
    rank, world = _rank_env()
    if world != cfg.world_size:
        raise FragmentFailed(f"launcher started {world} ranks, fragment expects {cfg.world_size}")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGUSR1, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)    # a terminal's Ctrl-C reaches the ranks too: checkpoint and stop
    kv = rank_store(cfg.timeout_s)
    if kv is not None:                     # tell the launcher that signals may now be forwarded safely
        kv.set(f"ready/{rank}", "1")
    torch.set_num_threads(cfg.threads_per_rank)
    use_cuda = cfg.backend == "nccl" or (cfg.backend == "auto" and torch.cuda.is_available())
    if cfg.deterministic:
        if use_cuda:       # deterministic cuBLAS needs a fixed workspace, set before the first matmul
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    device = torch.device(f"cuda:{_local_rank(rank) % max(torch.cuda.device_count(), 1)}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    jd = JobDir(cfg.checkpoint_dir)
    store = CheckpointStore(cfg.checkpoint_dir, keep=cfg.keep)
    return RankSetup(rank, world, kv, device, use_cuda, jd, store, _Saver(cfg, store, jd), time.perf_counter())


def join_group(cfg: FragmentConfig, rs: RankSetup) -> None:
    """The process group of the fragment's ranks (through the launcher's store, else MASTER_ADDR/PORT)."""
    if rs.world == 1:
        return
    timeout = timedelta(seconds=cfg.timeout_s)
    backend = "nccl" if rs.use_cuda else "gloo"
    if rs.kv is not None:
        dist.init_process_group(backend, store=dist.PrefixStore("pg", rs.kv), rank=rs.rank, world_size=rs.world,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rs.rank, world_size=rs.world, timeout=timeout,
                                init_method=f"tcp://{_master_addr()}:{os.environ.get('MASTER_PORT', '29500')}")


def step_flags(cfg: FragmentConfig, rs: RankSetup, loss: float) -> tuple[float, bool, bool]:
    """The end of a step, on every rank: one small all-reduce of the step's loss and everyone's stop flags
    (notice: a signal or the STOP file; the deadline), so all ranks stop at the same step."""
    stop = _STOP["flag"] or (cfg.watch_stop and rs.jd.stop_file.exists())
    late = cfg.deadline_s is not None and time.perf_counter() - rs.t0 >= cfg.deadline_s
    flags = torch.tensor([loss, float(stop), float(late)], dtype=torch.float64)
    if rs.world > 1:
        flags = flags.to(rs.device)
        dist.all_reduce(flags)
        flags = flags.cpu()
    return float(flags[0]), bool(flags[1] > 0), bool(flags[2] > 0)


def close_rank(rs: RankSetup, keep) -> None:
    if rs.world > 1:
        dist.barrier()
        # no teardown: freeing DDP's reducer or the gloo group here can deadlock (the group's destructor joins
        # its worker thread while holding the GIL that thread needs to free a finished barrier's tensors); the
        # rank process exits right after this (os._exit in the forkserver child) and nothing is freed at all
        _KEEP.append(keep)


def train_rank(cfg: FragmentConfig) -> FragmentResult | None:
    """The body of one rank. Returns the result on rank 0."""
    if cfg.loop:
        from .context import run_loop
        return run_loop(cfg)
    rs = open_rank(cfg)
    rank, world, device, jd, store, saver, t0 = rs.rank, rs.world, rs.device, rs.jd, rs.store, rs.saver, rs.t0
    wl = make_workload(cfg.workload, **{"seed": cfg.seed, **cfg.workload_args})
    data = wl.dataset()
    model = wl.build_model().to(device)
    blocks = wl.blocks(model)
    try:
        params = freeze_prefix(model, blocks, cfg.freeze_layers)
    except ValueError as e:
        raise FragmentFailed(str(e)) from None
    opt = wl.build_optimizer(params)
    total_steps = -(-cfg.total_samples // cfg.global_batch) if cfg.total_samples else None
    takes = inspect.signature(wl.build_scheduler).parameters       # user subclasses may take fewer arguments
    sched = wl.build_scheduler(opt, **{k: v for k, v in (("total_steps", total_steps),
                                                         ("steps_per_epoch", len(data) // cfg.global_batch))
                                       if k in takes})
    # read straight into the built model's tensors (no fresh pages, no second copy; load_state_dict below then
    # copies nothing): the restore reads and verifies the checkpoint and fills the model in one pass
    state = store.latest(into=model.state_dict())
    step = epoch = samples_done = pos = 0
    metrics: list[dict] = []
    if state is not None:
        model.load_state_dict(state.model)
        if state.optimizer is not None:     # written at another freeze level: renumbered
            opt.load_state_dict(carry_optimizer_state(state.optimizer, model, blocks,
                                                      state.extra.get("freeze_layers", 0), opt, wl.build_optimizer))
        if sched is not None and state.scheduler is not None:
            sched.load_state_dict(state.scheduler)
        if state.rng:
            restore_rng(state.rng)
        step, epoch, samples_done, pos = state.step, state.epoch, state.samples_done, state.data_position
        metrics = state.metrics
    else:
        torch.manual_seed(cfg.seed)
    grads = GradRecorder(blocks, cfg.freeze_layers, state.extra.get("grad_stats") if state is not None else None,
                         interval=cfg.grad_stats_interval)
    restore_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    net = model
    join_group(cfg, rs)
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if rs.use_cuda else None,
                                                        broadcast_buffers=False)
        net.register_comm_hook(None, _sum_hook)
    rendezvous_s = time.perf_counter() - t1

    def snapshot() -> TrainingState:
        return TrainingState(model=model.state_dict(), optimizer=opt.state_dict(),
                             scheduler=sched.state_dict() if sched is not None else None, rng=capture_rng(),
                             step=step, epoch=epoch, samples_done=samples_done, data_position=pos,
                             job={"name": cfg.job, "workload": cfg.workload, "global_batch": B},
                             metrics=metrics, extra={"freeze_layers": cfg.freeze_layers,
                                                     "grad_stats": grads.state()})

    n = len(data)
    fast = isinstance(data, TensorDataset)     # tensors indexed by a tensor of indices; others item by item
    B = cfg.global_batch
    micro = cfg.micro_batch or -(-B // world)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))
    start_step, start_samples = step, samples_done
    saved_step, saved_at = step, time.time()
    saver.durable = (saved_step, saved_at)     # on disk at the start: what this fragment restored
    saves, save_s = 0, 0.0
    last_report = 0.0
    t_train = time.perf_counter()
    train_started = time.time()
    stopped_by = StopReason.STEPS
    last_loss = float("nan")
    while True:
        if cfg.total_samples is not None and samples_done >= cfg.total_samples:
            stopped_by = StopReason.DONE
            break
        if cfg.steps is not None and step - start_step >= cfg.steps:
            stopped_by = StopReason.STEPS
            break
        if pos + B > n:                        # next epoch: a fresh permutation, the remainder is dropped
            epoch, pos = epoch + 1, 0
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))
        idx = perm[pos: pos + B][rank::world]
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        chunks = list(range(0, len(idx), micro))
        for i, c in enumerate(chunks):
            chunk = idx[c: c + micro]
            batch = _to(device, data[chunk] if fast else wl.collate([data[int(i)] for i in chunk]))
            last_micro = i == len(chunks) - 1
            with net.no_sync() if world > 1 and not last_micro else nullcontext():
                loss = wl.loss(net, batch) * (len(chunk) / B)   # sum of per-sample losses / global batch
                loss.backward()
            loss_sum += float(loss.detach())
        if rank == 0:
            grads.record(step)
        opt.step()
        if sched is not None:
            sched.step()
        step += 1
        pos += B
        samples_done += B
        if os.environ.get("PARSL_BFT_FAULT") == f"rank{rank}:step{step}":
            os.kill(os.getpid(), signal.SIGKILL)          # fault injection for tests
        last_loss, stop, late = step_flags(cfg, rs, loss_sum)
        if not math.isfinite(last_loss):       # every rank sees the same all-reduced loss: all stop here
            raise FragmentFailed(f"job {cfg.job}: the loss is {last_loss} at step {step}: not saving (the last "
                                 "finite checkpoint stays)")
        metrics.append({"step": step, "loss": last_loss, "world": world})
        if rank == 0:
            if wl.eval_every and step % wl.eval_every == 0:
                metrics[-1].update(_evaluate(wl, model))
            wl.log(metrics[-1])
        if stop or late:
            stopped_by = StopReason.SIGNAL if stop else StopReason.DEADLINE
            break
        if rank == 0:
            now = time.time()
            if cfg.checkpoint_every_s is not None and now - saved_at >= cfg.checkpoint_every_s \
                    and step > saved_step:
                ts = time.perf_counter()
                if saver.periodic(snapshot()):                # the pause is a memory copy; a thread writes
                    saves, save_s = saves + 1, save_s + time.perf_counter() - ts
                    saved_step, saved_at = step, time.time()
                    last_report = 0.0
            elif cfg.checkpoint_every_s is not None and step == start_step + 1:
                saver.background.prepare(snapshot())          # copy buffers ready before the first save
            if time.perf_counter() - last_report > 0.5:      # live progress for the orchestrator
                last_report = time.perf_counter()
                saver.report(Progress(step, samples_done, last_loss, world, saved_step, saved_at, time.time()))
    train_s = time.perf_counter() - t_train

    t2 = time.perf_counter()
    ckpt = ""
    if rank == 0:
        ckpt = str(saver.save(snapshot()))
        jd.write_progress(Progress(step, samples_done, last_loss, world, step, time.time(), time.time()))
    close_rank(rs, net)
    checkpoint_s = time.perf_counter() - t2
    if rank != 0:
        return None
    done = samples_done - start_samples
    res = FragmentResult(cfg.job, world, start_step, step, done, samples_done, train_s, restore_s, rendezvous_s,
                         checkpoint_s, done / train_s if train_s > 0 else 0.0, stopped_by, last_loss, ckpt,
                         [str(e) for e in store.skipped], train_started, saves, save_s / saves if saves else 0.0,
                         grads.report())
    if rs.kv is not None:
        rs.kv.set("result", res.to_json())
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parsl_bft.train.fragment",
                                 description="one rank of a training fragment (launch n of them with srun/mpiexec)")
    ap.add_argument("--config", required=True, help="FragmentConfig as JSON")
    args = ap.parse_args(argv)
    cfg = FragmentConfig.from_json(Path(args.config).read_text())
    res = train_rank(cfg)
    if res is not None and "PARSL_BFT_STORE" not in os.environ:
        print(res.to_json())
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)          # no interpreter teardown of the process group (see the end of train_rank)
