"""One training fragment: restore -> rendezvous on n ranks -> train -> checkpoint -> report.

Run it as a function (``run_fragment(cfg)`` starts the n ranks as local processes, as a Parsl python_app
would) or launch ranks yourself (``srun python -m parsl_bft.train.fragment --config cfg.json`` in a bash_app);
each rank reads its rank and world size from the launcher's environment.

Data parallelism keeps the GLOBAL batch constant across world sizes: every step consumes the next
``global_batch`` samples of a seeded per-epoch permutation, rank r takes every world-th of them (in
micro-batches of at most ``micro_batch``, accumulating), the per-rank sums of per-sample gradients are
all-reduced and divided by the global batch. So a step is the same computation on 1 or 8 ranks, up to the
order of floating-point additions, and at a fixed world size it is bit-for-bit reproducible.

Stopping: after ``steps`` steps, at ``deadline_s`` seconds, when the job's ``total_samples`` are done, or on
SIGTERM / SIGUSR1 (the reclaim notice; any rank receiving it stops all ranks at the same step through a MAX
all-reduce). Then rank 0 writes the checkpoint and the result.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import CheckpointStore, TrainingState, capture_rng, restore_rng
from .workloads import make_workload


@dataclass
class FragmentConfig:
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
    workload_args: dict = field(default_factory=dict)
    freeze_layers: int = 0
    keep: int = 3
    backend: str = "auto"             # gloo | nccl | auto (nccl when CUDA is there)
    threads_per_rank: int = 1
    deterministic: bool = True
    timeout_s: float = 60.0           # collective timeout: a dead peer fails the fragment, it does not hang
    result_path: str | None = None
    fsync: bool = True
    stop_file: str | None = None      # the orchestrator's "stop and checkpoint" request (shared file system)
    generation: str | None = None     # fencing: save only while <checkpoint_dir>/GENERATION still says this

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.global_batch < self.world_size:
            raise ValueError(f"global_batch {self.global_batch} < world_size {self.world_size}: every rank needs "
                             "at least one sample per step")
        if self.steps is None and self.deadline_s is None and self.total_samples is None:
            raise ValueError("a fragment needs a bound: steps, deadline_s or total_samples")


@dataclass
class FragmentResult:
    job: str
    world_size: int
    start_step: int
    end_step: int
    samples: int                      # samples trained in this fragment
    samples_done: int                 # job total after it
    train_s: float
    restore_s: float
    rendezvous_s: float
    checkpoint_s: float
    throughput: float                 # samples/s while training
    stopped_by: str                   # steps | deadline | signal | done
    loss: float
    checkpoint: str
    skipped_checkpoints: list[str] = field(default_factory=list)
    train_started: float = 0.0        # unix time the first step began (node joined -> training latency)


class FragmentFailed(RuntimeError):
    """A rank died or the fragment could not run; the job resumes from its last good checkpoint."""


_STOP = {"flag": False}


def _on_signal(signum, frame):  # noqa: ARG001
    _STOP["flag"] = True


def _rank_env() -> tuple[int, int]:
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("PMI_RANK", "PMI_SIZE"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", "PMIX_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def _master_addr() -> str:
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodes:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    return "127.0.0.1"


def train_rank(cfg: FragmentConfig) -> FragmentResult | None:
    """The body of one rank. Returns the result on rank 0."""
    rank, world = _rank_env()
    if world != cfg.world_size:
        raise FragmentFailed(f"launcher started {world} ranks, fragment expects {cfg.world_size}")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGUSR1, _on_signal)
    if cfg.result_path:   # tell a local launcher that signals may now be forwarded safely
        Path(f"{cfg.result_path}.ready{rank}").touch()
    torch.set_num_threads(cfg.threads_per_rank)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    use_cuda = cfg.backend == "nccl" or (cfg.backend == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank)) % max(torch.cuda.device_count(), 1)}"
                          if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    t0 = time.perf_counter()
    store = CheckpointStore(cfg.checkpoint_dir, keep=cfg.keep)
    wl = make_workload(cfg.workload, **{"seed": cfg.seed, **cfg.workload_args})
    data = wl.dataset()
    model = wl.build_model().to(device)
    blocks = wl.blocks(model)
    if cfg.freeze_layers > len(blocks):
        raise FragmentFailed(f"freeze_layers={cfg.freeze_layers} but the model has {len(blocks)} blocks")
    for b in blocks[: cfg.freeze_layers]:
        for p in b.parameters():
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = wl.build_optimizer(params)
    sched = wl.build_scheduler(opt)
    state = store.latest()
    step = epoch = samples_done = pos = 0
    metrics: list[dict] = []
    if state is not None:
        model.load_state_dict(state.model)
        if state.extra.get("freeze_layers", 0) == cfg.freeze_layers and state.optimizer is not None:
            opt.load_state_dict(state.optimizer)
        if sched is not None and state.scheduler is not None:
            sched.load_state_dict(state.scheduler)
        if state.rng:
            restore_rng(state.rng)
        step, epoch, samples_done, pos = state.step, state.epoch, state.samples_done, state.data_position
        metrics = state.metrics
    else:
        torch.manual_seed(cfg.seed)
    restore_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=cfg.timeout_s),
                                init_method=f"tcp://{_master_addr()}:{os.environ.get('MASTER_PORT', '29500')}")
    rendezvous_s = time.perf_counter() - t1

    n = len(data)
    B = cfg.global_batch
    micro = cfg.micro_batch or -(-B // world)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))
    start_step, start_samples = step, samples_done
    progress_file = Path(cfg.checkpoint_dir) / "progress.json"
    last_report = 0.0
    t_train = time.perf_counter()
    train_started = time.time()
    stopped_by = "steps"
    loss_sum = torch.zeros(1, dtype=torch.float64)
    last_loss = float("nan")
    while True:
        if cfg.total_samples is not None and samples_done >= cfg.total_samples:
            stopped_by = "done"
            break
        if cfg.steps is not None and step - start_step >= cfg.steps:
            stopped_by = "steps"
            break
        stop = _STOP["flag"] or (cfg.stop_file is not None and os.path.exists(cfg.stop_file))
        flags = torch.tensor([float(stop),
                              float(cfg.deadline_s is not None and time.perf_counter() - t0 >= cfg.deadline_s)])
        if world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0] > 0 or flags[1] > 0:
            stopped_by = "signal" if flags[0] > 0 else "deadline"
            break
        if pos + B > n:                        # next epoch: a fresh permutation, the remainder is dropped
            epoch, pos = epoch + 1, 0
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))
        idx = perm[pos: pos + B][rank::world]
        opt.zero_grad(set_to_none=False)
        loss_sum.zero_()
        for c in range(0, len(idx), micro):
            chunk = idx[c: c + micro]
            batch = [t.to(device) for t in data[chunk]]
            loss = wl.loss(model, batch) * (len(chunk) / B)   # sum of per-sample losses / global batch
            loss.backward()
            loss_sum += loss.detach().double().cpu()
        if world > 1:
            grads = [p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads] + [loss_sum.to(grads[0].dtype).to(device)])
            dist.all_reduce(flat)
            off = 0
            for g in grads:
                g.copy_(flat[off: off + g.numel()].view_as(g))
                off += g.numel()
            last_loss = float(flat[-1])
        else:
            last_loss = float(loss_sum)
        opt.step()
        if sched is not None:
            sched.step()
        step += 1
        pos += B
        samples_done += B
        if os.environ.get("PARSL_BFT_FAULT") == f"rank{rank}:step{step}":
            os.kill(os.getpid(), signal.SIGKILL)          # fault injection for tests
        metrics.append({"step": step, "loss": last_loss, "world": world})
        if rank == 0 and time.perf_counter() - last_report > 0.5:   # live progress for the orchestrator
            last_report = time.perf_counter()
            progress_file.write_text(json.dumps({"step": step, "samples_done": samples_done, "loss": last_loss,
                                                 "world": world}))
    train_s = time.perf_counter() - t_train

    t2 = time.perf_counter()
    ckpt = ""
    if rank == 0 and cfg.generation is not None:
        gen = Path(cfg.checkpoint_dir) / "GENERATION"
        if gen.exists() and gen.read_text().strip() != cfg.generation:
            raise FragmentFailed(f"fragment of {cfg.job} is stale (generation {cfg.generation}, the job is now at "
                                 f"{gen.read_text().strip()}): not saving")
    if rank == 0:
        ts = TrainingState(model=model.state_dict(), optimizer=opt.state_dict(),
                           scheduler=sched.state_dict() if sched is not None else None, rng=capture_rng(),
                           step=step, epoch=epoch, samples_done=samples_done, data_position=pos,
                           job={"name": cfg.job, "workload": cfg.workload, "global_batch": B},
                           metrics=metrics, extra={"freeze_layers": cfg.freeze_layers})
        ckpt = str(store.save(ts, fsync=cfg.fsync))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    checkpoint_s = time.perf_counter() - t2
    if rank != 0:
        return None
    done = samples_done - start_samples
    res = FragmentResult(cfg.job, world, start_step, step, done, samples_done, train_s, restore_s, rendezvous_s,
                         checkpoint_s, done / train_s if train_s > 0 else 0.0, stopped_by, last_loss, ckpt,
                         [str(e) for e in store.skipped], train_started)
    if cfg.result_path:
        Path(cfg.result_path).write_text(json.dumps(asdict(res)))
    return res


def _free_port(host: str = "") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_fragment(cfg: FragmentConfig, *, env: dict | None = None, ranks: list[int] | None = None,
                 master: tuple[str, int] | None = None) -> FragmentResult | None:
    """Start ranks of the fragment as local processes, wait, and return rank 0's result.

    By default all ``cfg.world_size`` ranks run here. A gang spread over nodes runs ``ranks`` (this node's share)
    against ``master`` (rank 0's host and port); it returns None unless it ran rank 0.
    If any rank dies, the others are killed at once and FragmentFailed names it; no checkpoint is written by
    a failed fragment, so the job resumes from the last good one. SIGTERM / SIGUSR1 sent to this process are
    passed to the ranks (the reclaim notice).
    """
    ranks = list(range(cfg.world_size)) if ranks is None else list(ranks)
    addr, port = master or ("127.0.0.1", _free_port("127.0.0.1"))
    workdir = Path(cfg.checkpoint_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    result = workdir / f".result-{os.getpid()}-{time.monotonic_ns()}.json"
    cfg_file = result.with_suffix(".cfg.json")
    cfg_file.write_text(json.dumps({**asdict(cfg), "result_path": str(result)}))
    procs, logs = [], [result.with_suffix(f".rank{r}.log") for r in ranks]
    for i, r in enumerate(ranks):
        e = {**os.environ, **(env or {}), "RANK": str(r), "WORLD_SIZE": str(cfg.world_size), "LOCAL_RANK": str(i),
             "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        procs.append(_Rank(str(cfg_file), e, str(logs[i])))

    pending: list[int] = []

    def forward(signum, frame):  # noqa: ARG001
        pending.append(signum)
    ready = [Path(f"{result}.ready{r}") for r in ranks]
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)} \
        if _in_main_thread() else {}
    # lets an orchestrator kill the ranks of a reclaimed node, or stale ones
    pids = workdir / (".ranks.pid" if len(ranks) == cfg.world_size else f".ranks-{ranks[0]}.pid")
    pids.write_text(" ".join([socket.gethostname(), *(str(p.pid) for p in procs)]))   # pids mean nothing elsewhere
    try:
        while any(p.poll() is None for p in procs):
            # a rank that has not installed its handlers yet would die of the signal: wait until all have
            if pending and all(r.exists() for r in ready):
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(pending[0])
                pending.clear()
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
        if any(p.poll() not in (None, 0) for p in procs):
            # the peers of a dead rank fail too (connection reset); give them a moment, then blame the rank
            # that died of a signal (killed, reclaimed) before the ones that merely lost it
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            codes = [p.poll() for p in procs]          # before we kill the rest ourselves
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            i = min((i for i, c in enumerate(codes) if c not in (None, 0)), key=lambda i: (codes[i] >= 0, i))
            err = logs[i].read_text(errors="replace").strip().splitlines()
            raise FragmentFailed(f"fragment of {cfg.job}: rank {ranks[i]} exited with {codes[i]}"
                                 f"{': ' + err[-1] if err else ''}")
        if 0 not in ranks:
            return None
        if not result.exists():
            raise FragmentFailed(f"fragment of {cfg.job}: rank 0 wrote no result")
        return FragmentResult(**json.loads(result.read_text()))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in [result, cfg_file, pids, *ready, *logs]:
            f.unlink(missing_ok=True)


def node_name() -> str:
    """This node, named as the scheduler names it (the pool's node ids)."""
    return (os.environ.get("PARSL_BFT_NODE") or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname().split(".")[0])


def run_gang_rank(cfg: FragmentConfig, rank: int, rendezvous: str) -> FragmentResult | None:
    """One rank of a fragment whose ranks were placed by the executor, one per node.

    Writes ``<rendezvous>.node<rank>`` (where it runs: the orchestrator's books follow the executor's placement);
    rank 0 publishes its host and a free port in ``<rendezvous>`` (shared file system), the others wait for it
    up to ``cfg.timeout_s``."""
    Path(f"{rendezvous}.node{rank}").write_text(node_name())
    rdzv = Path(rendezvous)
    if rank == 0:
        host = socket.gethostname()
        tmp = rdzv.with_name(rdzv.name + ".tmp")
        tmp.write_text(json.dumps([host, _free_port()]))
        os.replace(tmp, rdzv)
    deadline = time.monotonic() + cfg.timeout_s
    while not rdzv.exists():
        if time.monotonic() > deadline:
            raise FragmentFailed(f"fragment of {cfg.job}: rank 0 did not start within {cfg.timeout_s:.0f} s "
                                 f"(no {rdzv})")
        time.sleep(0.1)
    host, port = json.loads(rdzv.read_text())
    return run_fragment(cfg, ranks=[rank], master=(host, int(port)))


_CTX = None


def _rank_context():
    """A forkserver that has imported torch and this module once: ranks start in milliseconds instead of
    paying Python + torch start-up (seconds) for every fragment. (A process forked - without exec - from one
    that already started the forkserver cannot use it; Parsl's workers and launchers exec, so they can.)"""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp
        _CTX = mp.get_context("forkserver")
        # '__main__' too: otherwise every rank re-runs the parent's main script (for a Parsl worker that is
        # process_worker_pool.py and all of Parsl) before it starts - about a second per rank here
        _CTX.set_forkserver_preload(["__main__", "parsl_bft.train.rank_preload"])
    return _CTX


def _noop() -> None:
    pass


def start_rank_server() -> None:
    """Start the forkserver now (and wait until it has imported everything), not at the first fragment."""
    p = _rank_context().Process(target=_noop)
    p.start()
    p.join()


def _rank_entry(cfg_file: str, env: dict, log_path: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)       # a file, not a pipe: a chatty rank must never block on stderr
    os.close(fd)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    main(["--config", cfg_file])


class _Rank:
    """One rank process (from the forkserver), with the few Popen-like calls the launcher uses."""

    def __init__(self, cfg_file: str, env: dict, log_path: str):
        self.p = _rank_context().Process(target=_rank_entry, args=(cfg_file, env, log_path), daemon=False)
        self.p.start()
        self.pid = self.p.pid

    def poll(self):
        return self.p.exitcode

    @property
    def returncode(self):
        return self.p.exitcode

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self) -> None:
        self.p.join()


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parsl_bft.train.fragment",
                                 description="one rank of a training fragment (launch n of them with srun/mpiexec)")
    ap.add_argument("--config", required=True, help="FragmentConfig as JSON")
    args = ap.parse_args(argv)
    cfg = FragmentConfig(**json.loads(Path(args.config).read_text()))
    res = train_rank(cfg)
    if res is not None and not cfg.result_path:
        print(json.dumps(asdict(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
