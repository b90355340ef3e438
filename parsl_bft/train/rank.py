"""One rank of a fragment: who it is (from its launcher's environment), its store client, its device and job
files, its process group, and the per-step agreement of all ranks on the loss and on stopping.

A rank reads its rank and world size from whichever launcher started it (``launcher.run_fragment``, srun,
mpiexec) and meets its peers through the fragment's TCPStore (``PARSL_BFT_STORE``) or, under srun/mpiexec,
through MASTER_ADDR/MASTER_PORT.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore  # typed here; dist re-exports them

from .checkpoint import CheckpointStore
from .config import FragmentConfig, FragmentFailed
from .protocol import JobDir
from .saver import Saver

_STOP = {"flag": False}        # a notice arrived (SIGTERM / SIGUSR1 / SIGINT): stop at the end of this step
_KEEP: list[Any] = []          # what must outlive the training function in a rank process (see close_rank)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _STOP["flag"] = True


def rank_env() -> tuple[int, int]:
    """(rank, world size) as the launcher that started this process says; (0, 1) without one."""
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("PMI_RANK", "PMI_SIZE"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", "PMIX_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def local_rank(rank: int) -> int:
    """This rank's index on its node (the launcher's; it picks the accelerator), else the global rank."""
    for v in ("LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID"):
        if v in os.environ:
            return int(os.environ[v])
    return rank


def open_store(addr: str, timeout_s: float) -> Store:
    """A client of the rendezvous store at ``addr``: ``SECRET@HOST:PORT``, every key under the run's secret (a
    client without it can neither read nor change them), or ``HOST:PORT`` (no secret)."""
    secret, _, where = addr.rpartition("@")
    host, port = where.rsplit(":", 1)
    base = TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    return PrefixStore(secret, base) if secret else base


def store_client(addr: str, fragment: str, timeout_s: float) -> Store:
    """A client of the store at ``addr`` ([SECRET@]HOST:PORT), its keys under ``fragment``."""
    return PrefixStore(fragment, open_store(addr, timeout_s))


def rank_store(timeout_s: float) -> Store | None:
    """The TCPStore client of this fragment (``PARSL_BFT_STORE``: ``open_store``'s address, keys under the
    fragment id)."""
    addr = os.environ.get("PARSL_BFT_STORE")
    return store_client(addr, os.environ["PARSL_BFT_FRAGMENT"], timeout_s) if addr else None


def _master_addr() -> str:
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodes:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    return "127.0.0.1"


@dataclass
class RankSetup:
    """What every rank of a fragment has once it started: who it is, its device, its job's files."""

    rank: int
    world: int
    kv: Store | None
    device: torch.device
    use_cuda: bool
    jd: JobDir
    store: CheckpointStore
    saver: Saver
    t0: float                          # perf_counter at the start (deadline_s counts from here)


def open_rank(cfg: FragmentConfig) -> RankSetup:
    """Signals, the launcher handshake, threads, determinism, the device and the job's checkpoint store."""
    rank, world = rank_env()
    if world != cfg.world_size:
        raise FragmentFailed(f"launcher started {world} ranks, fragment expects {cfg.world_size}")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGUSR1, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)    # a terminal's Ctrl-C reaches the ranks too: checkpoint and stop
    kv = rank_store(cfg.timeout_s)
    jd = JobDir(cfg.checkpoint_dir)
    if kv is not None:                     # tell the launcher that signals may now be forwarded safely
        jd.mark_ready(cfg.fragment_id, rank)
    torch.set_num_threads(cfg.threads_per_rank)
    use_cuda = cfg.backend == "nccl" or (cfg.backend == "auto" and torch.cuda.is_available())
    if cfg.deterministic:
        if use_cuda:       # deterministic cuBLAS needs a fixed workspace, set before the first matmul
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    device = torch.device(f"cuda:{local_rank(rank) % max(torch.cuda.device_count(), 1)}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    store = CheckpointStore(cfg.checkpoint_dir, keep=cfg.keep)
    return RankSetup(rank, world, kv, device, use_cuda, jd, store, Saver(cfg, store, jd), time.perf_counter())


def join_group(cfg: FragmentConfig, rs: RankSetup) -> None:
    """The process group of the fragment's ranks (through the launcher's store, else MASTER_ADDR/PORT)."""
    if rs.world == 1:
        return
    timeout = timedelta(seconds=cfg.timeout_s)
    backend = "nccl" if rs.use_cuda else "gloo"
    if rs.kv is not None:
        dist.init_process_group(backend, store=PrefixStore("pg", rs.kv), rank=rs.rank, world_size=rs.world,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rs.rank, world_size=rs.world, timeout=timeout,
                                init_method=f"tcp://{_master_addr()}:{os.environ.get('MASTER_PORT', '29500')}")


def fault_point(rank: int, step: int) -> None:
    """Fault injection for tests: ``PARSL_BFT_FAULT=rank<r>:step<s>`` SIGKILLs rank r once it has counted step
    s (a rank lost without notice, mid-fragment)."""
    if os.environ.get("PARSL_BFT_FAULT") == f"rank{rank}:step{step}":
        os.kill(os.getpid(), signal.SIGKILL)


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


def close_rank(rs: RankSetup, keep: object) -> None:
    """The last collective of a fragment (every rank has saved or returned); ``keep`` (the DDP module) lives on."""
    if rs.world > 1:
        dist.barrier()
        # no teardown: freeing DDP's reducer or the gloo group here can deadlock (the group's destructor joins
        # its worker thread while holding the GIL that thread needs to free a finished barrier's tensors); the
        # rank process exits right after this (os._exit in the forkserver child) and nothing is freed at all
        _KEEP.append(keep)
