"""Starting a fragment's ranks: on this machine, or a node's share of a gang spread over nodes.

Ranks fork from a per-process forkserver that has imported torch, the fragment code and the parent's main
script once (milliseconds instead of seconds per rank). They meet through a torch TCPStore: the one the caller
names (an orchestrator serves one for all its fragments, reachable from every node), or one this launcher serves
on 127.0.0.1. What the launcher needs back from its own ranks (which are ready for signals, rank 0's result)
comes as files in the job's folder (``JobDir``), so that a local launcher never imports torch: this module does
not, and a Parsl worker warms up in its forkserver's one torch import. Gangs tell through the store which node
each share landed on.

A failed rank writes an error record (``protocol.JobDir.record_error``); the launcher reports the rank that
failed first, with its traceback, and kills its own remaining ranks. No checkpoint is written by a failed
fragment, so the job resumes from the last good one.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait as wait_any
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import ParslBftError
from ..parent_death import signal_on_parent_death
from ..safe_python import python_command, safe_path_env
from .config import FragmentConfig, FragmentFailed, FragmentResult
from .leftovers import SHARE_ENV, adopt_orphans, kill_descendants, kill_share_processes, share_mark
from .protocol import JobDir
from .rank_client import ENV as RANK_SERVER_ENV
from .rank_client import RankServerGone, ServedProcess
from .rank_output import LOG_MAX, output_to_log

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store, TCPStore  # typed here; torch.distributed re-exports


def node_name() -> str:
    """This node, named as the scheduler names it (the pool's node ids)."""
    return (os.environ.get("PARSL_BFT_NODE") or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname().split(".")[0])


STORE_MEMORY = 256 << 20   # bytes the store's process may grow by past its start (a flood of keys ends it, not us)
# The store's own process: a TCPStore server on the socket it is handed, its address space capped once it runs; it
# ends when its stdin (a pipe the starting process holds) closes, or with the thread that started it.
_SERVE = """
import resource, signal, sys
from datetime import timedelta
from parsl_bft.parent_death import signal_on_parent_death
signal_on_parent_death(signal.SIGKILL)
fd, host, port, memory = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from torch._C._distributed_c10d import TCPStore
store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60),
                 master_listen_fd=fd)
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + memory, size + memory))
sys.stdin.buffer.read()
"""


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _listen(host: str) -> socket.socket:
    """A listening socket on ``host`` (an address or a name of this host; "": every interface), on a port the
    kernel picks. A name that is no address of this host, or that this host resolves to loopback (another node
    would not), listens on every interface, as before, with a warning: the store's secret still keeps its keys."""
    try:
        addrs = [] if not host else socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:                     # a name this host cannot resolve
        addrs = []
    for family, _, _, _, sockaddr in addrs:
        ip = str(sockaddr[0])
        if ipaddress.ip_address(ip.split("%")[0]).is_loopback and not _loopback(host):
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((ip, 0))
        except OSError:
            sock.close()
            continue
        sock.listen(512)
        return sock
    if host:
        warnings.warn(f"the rendezvous store listens on every interface: {host!r} is no address of this host "
                      "(its keys are under the run's secret)", stacklevel=3)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    sock.listen(512)
    return sock


class RendezvousLost(ParslBftError):
    """The run's rendezvous store ended: ranks can no longer meet, so the run stops (saying so) instead of
    launching fragments that cannot start."""


class RendezvousStore:
    """A run's rendezvous store: a torch TCPStore served by a small process of its own (``_SERVE``), so that a
    client storing huge keys is cut off there - its address space is capped (``memory`` bytes past its start) -
    and never grows the caller's memory. It listens on ``host`` only (loopback by default) and every key lives under a
    secret made here: a client that lacks it cannot read or change the ranks' keys. Ranks are handed
    ``address(...)``: ``SECRET@HOST:PORT`` (``rank.open_store`` reads it).

    The process ends with ``close()``, when this object is collected, when the thread that made it ends (the
    orchestrator's loop: the run), or when this process dies however it dies (its stdin, a pipe held here,
    closes; and the kernel's parent-death signal)."""

    def __init__(self, host: str = "127.0.0.1", memory: int = STORE_MEMORY) -> None:
        self.secret = secrets.token_hex(16)
        sock = _listen(host)
        ip, self.port = sock.getsockname()[:2]
        self.host = "127.0.0.1" if ip in ("0.0.0.0", "::") else str(ip)     # where this process reaches it
        self.listening = str(ip)
        alive, self._alive = os.pipe()
        try:
            # -P: _SERVE imports parsl_bft and torch, never from the folder this process happens to be in
            self._proc = subprocess.Popen(python_command("-c", _SERVE, str(sock.fileno()), self.host,
                                                         str(self.port), str(memory)),
                                          # stderr too: a client flooding it with keys made it print C++
                                          # stack traces into the user's terminal (its end is told by
                                          # check_alive, with its exit status)
                                          stdin=alive, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          pass_fds=(sock.fileno(),), start_new_session=True)   # no Ctrl-C
        finally:
            os.close(alive)
            sock.close()
        self._end = weakref.finalize(self, _end_store, self._proc, self._alive)
        self._client: Store | None = None

    def address(self, host: str | None = None) -> str:
        """What a rank is told: the secret, and the store at ``host`` (default: where this process reaches it)."""
        return f"{self.secret}@{host or self.host}:{self.port}"

    @property
    def client(self) -> Store:
        """This process's own client of the store, its keys under the secret (connected at first use)."""
        if self._client is None:
            from .rank import open_store

            self._client = open_store(self.address(), 60.0)
        return self._client

    def check(self, keys: list[str]) -> bool:
        """Whether every key is set."""
        return self.client.check(keys)

    def get(self, key: str) -> bytes:
        """A key's value (waits for it)."""
        return self.client.get(key)

    def set(self, key: str, value: str) -> None:
        """Set a key."""
        self.client.set(key, value)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` ("" : unset); its value after."""
        return self.client.compare_set(key, expected, desired)

    def alive(self) -> bool:
        """Whether the store's process still runs."""
        return self._proc.poll() is None

    def check_alive(self) -> None:
        """``RendezvousLost`` if the store's process has ended (killed, out of its memory cap): no fragment could
        start any more, and the run would stall at the same progress with no error."""
        code = self._proc.poll()
        if code is not None:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            raise RendezvousLost(f"the run's rendezvous store (process {self._proc.pid}) ended ({how}): no fragment "
                                 "can start; the run stops (run it again: jobs resume from their newest checkpoints)")

    def close(self) -> None:
        """End the store's process."""
        self._client = None
        self._end()


def _end_store(proc: subprocess.Popen[bytes], alive: int) -> None:
    # killed, not asked: it holds nothing worth a clean end, and a run that ends at once (a rerun with every job
    # done) would otherwise wait for it to finish importing torch before it reads its stdin (4-5 s)
    os.close(alive)
    proc.kill()
    proc.wait()


def serve_store(host: str = "127.0.0.1") -> RendezvousStore:
    """The rendezvous store of a run (``RendezvousStore``), listening on ``host``: loopback (default: every rank
    on this node), the address the ranks reach this host on, or "": every interface."""
    return RendezvousStore(host)


def _serve_here() -> TCPStore:
    """A lone fragment's own store, in this process, on loopback only (its ranks are this launcher's children)."""
    from torch._C._distributed_c10d import TCPStore

    sock = _listen("127.0.0.1")
    port = sock.getsockname()[1]
    return TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=60), master_listen_fd=sock.detach())   # the store owns it


def run_fragment(cfg: FragmentConfig, *, env: dict[str, str] | None = None, ranks: list[int] | None = None,
                 store: str | None = None) -> FragmentResult | None:
    """Start ranks of the fragment as local processes, wait, and return rank 0's result.

    By default all ``cfg.world_size`` ranks run here; a gang's node runs ``ranks`` (its share) and returns None
    unless it ran rank 0. ``store`` is host:port of the TCPStore every share of the fragment uses (default:
    one served here). SIGTERM / SIGUSR1 sent to this process are passed to the ranks (the reclaim notice)."""
    ranks = list(range(cfg.world_size)) if ranks is None else list(ranks)
    jd = JobDir(cfg.checkpoint_dir).ensure()
    server = None
    if store is None:
        server = _serve_here()
        store = f"{secrets.token_hex(16)}@127.0.0.1:{server.port}"
    cfg_file = jd.path / f".cfg-{socket.gethostname()}-{cfg.fragment_id}-{ranks[0]}.json"
    cfg_file.write_text(cfg.to_json())
    logs = [jd.log_path(cfg.fragment_id, r) for r in ranks]
    logs[0].parent.mkdir(exist_ok=True)
    procs = _start_ranks(cfg, jd, cfg_file, ranks, logs, env or {}, store)
    pids = jd.record_ranks(cfg.fragment_id, [p.pid for p in procs], node_name())

    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        _wait_ranks(procs, ranks, jd, cfg.fragment_id, pending)
        if any(p.poll() not in (None, 0) for p in procs):
            _fail(cfg, jd, procs, ranks, logs)
        if 0 not in ranks:
            return None
        result = jd.read_result(cfg.fragment_id)
        if result is None:
            raise FragmentFailed(f"fragment of {cfg.job}: rank 0 wrote no result")
        return FragmentResult.from_json(result)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        kill_share_processes(share_mark(cfg.fragment_id, ranks[0]), [p.pid for p in procs])   # and what they started
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in (cfg_file, pids):
            f.unlink(missing_ok=True)
        jd.end_handshake(cfg.fragment_id, ranks)
        jd.prune_logs()                         # rank output stays on disk, the newest few fragments' of it
        if len(ranks) == cfg.world_size:        # all ranks were ours: their error records are reported
            jd.forget_fragment(cfg.fragment_id)
        del server


def _start_ranks(cfg: FragmentConfig, jd: JobDir, cfg_file: Path, ranks: list[int], logs: list[Path],
                 env: dict[str, str], store: str) -> list[_Rank]:
    """The processes of ``ranks``, each told who it is (and its local index) as torchrun tells its workers, and
    where the fragment's store is."""
    procs = []
    for i, r in enumerate(ranks):
        e = {**os.environ, **env, "RANK": str(r), "WORLD_SIZE": str(cfg.world_size), "LOCAL_RANK": str(i),
             "LOCAL_WORLD_SIZE": str(len(ranks)), "PARSL_BFT_STORE": store, "PARSL_BFT_FRAGMENT": cfg.fragment_id,
             SHARE_ENV: share_mark(cfg.fragment_id, ranks[0])}
        procs.append(_Rank(str(cfg_file), e, str(logs[i]), str(jd.path), cfg.fragment_id, r))
    return procs


def _wait_ranks(procs: list[_Rank], ranks: list[int], jd: JobDir, fragment: str, pending: list[int]) -> None:
    """Until every rank has exited or one has failed, passing the ``pending`` signals on to them."""
    while any(p.poll() is None for p in procs):
        # a rank that has not installed its handlers yet would die of the signal: wait until all have
        if pending and jd.all_ready(fragment, ranks):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(pending[0])
            pending.clear()
        if any(p.poll() not in (None, 0) for p in procs):
            break
        # woken by a rank's exit at once (not at the next poll), or after 50 ms for forwarded signals
        wait_any([p.sentinel for p in procs if p.poll() is None], timeout=0.05)


def _fail(cfg: FragmentConfig, jd: JobDir, procs: list[_Rank], ranks: list[int], logs: list[Path]) -> None:
    """The peers of a dead rank fail too (connection reset): give them a moment, then blame the rank that died
    of a signal (killed, reclaimed), else the first error record, before the ones that merely lost a peer."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    codes = [p.poll() for p in procs]          # before we kill the rest ourselves
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    signalled = [i for i, c in enumerate(codes) if c is not None and c < 0]
    errors = jd.errors(cfg.fragment_id)
    if signalled or not errors:
        i = signalled[0] if signalled else next(i for i, c in enumerate(codes) if c not in (None, 0))
        tail = logs[i].read_text(errors="replace").strip().splitlines()[-12:] if logs[i].exists() else []
        detail = ("\n" + "\n".join(tail)) if tail else ""
        raise FragmentFailed(f"fragment of {cfg.job}: rank {ranks[i]} exited with {codes[i]}{detail}\n"
                             f"(its output: {logs[i]})")
    first = errors[0]
    log = jd.log_path(cfg.fragment_id, first.rank)
    raise FragmentFailed(f"fragment of {cfg.job}: {first.summary()}\n(rank {first.rank}'s output: {log})")


def run_gang_task(cfg: FragmentConfig, node_index: int, store: str) -> FragmentResult | None:
    """One node's share of a fragment whose nodes were chosen by the executor: ranks
    ``node_index * ranks_per_node ...`` on this node, bound to its accelerators by local rank. Says which node
    it landed on (the orchestrator's books follow the executor's placement). A share the orchestrator gave up
    before it started returns None at once: no rank starts, nothing is written."""
    if not claim_share(store, cfg.fragment_id, node_index, cfg.timeout_s):
        return None            # given up while it waited for a worker (FragmentHandle.abandon): never start
    k = cfg.ranks_per_node
    return run_fragment(cfg, ranks=list(range(node_index * k, (node_index + 1) * k)), store=store)


GIVEN_UP = 3        # _claim's exit status for a share the orchestrator gave up


def claim_share(store: str, fragment: str, index: int, timeout_s: float) -> bool:
    """Mark share ``index`` of ``fragment`` started in the orchestrator's store, unless it was given up (False),
    and say this node. The store client needs torch, which this worker never imports: a child of the rank
    forkserver (torch imported there) does it, in milliseconds."""
    code = _run_child(_claim, store, fragment, index, node_name(), timeout_s)
    if code not in (0, GIVEN_UP):
        raise FragmentFailed(f"fragment {fragment}: share {index} could not reach the orchestrator's store "
                             f"({store.partition('@')[2]}) to start (exit status {code})")
    return code == 0


def _claim(store: str, fragment: str, index: int, node: str, timeout_s: float) -> None:
    from .rank import store_client

    kv = store_client(store, fragment, timeout_s)
    if kv.compare_set(f"share/{index}", "", "started") != b"started":
        sys.exit(GIVEN_UP)
    kv.set(f"node/{index}", node)


_CTX: ForkServerContext | None = None
MAIN_ENV = "PARSL_BFT_FORKSERVER_MAIN"     # the parent's main module, for the forkserver to preload (rank_preload)


def _rank_context() -> ForkServerContext:
    """A forkserver that has imported torch, this module and the parent's main module once: ranks start in
    milliseconds instead of paying Python + torch start-up (seconds) for every fragment. (A process forked -
    without exec - from one that already started the forkserver cannot use it; Parsl's workers and launchers
    exec, so they can.)"""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp
        from multiprocessing import forkserver, spawn
        ctx = mp.get_context("forkserver")
        # not '__main__': the forkserver's own preloading of it is dead code on Python 3.11 and 3.12 (rank_preload)
        ctx.set_forkserver_preload(["parsl_bft.train.rank_preload"])
        main = {k: v for k, v in spawn.get_preparation_data("rank").items()
                if k in ("sys_path", "sys_argv", "init_main_from_name", "init_main_from_path")}
        os.environ[MAIN_ENV] = json.dumps(main)         # the forkserver inherits this environment as it starts
        try:
            # it starts as `python -c ...` in this process's folder and imports parsl_bft (and 3.11 ignores the
            # sys.path it is handed): a safe path, so a package planted in the folder is never imported
            with safe_path_env():
                forkserver.ensure_running()
        finally:
            os.environ.pop(MAIN_ENV, None)
        _CTX = ctx
    return _CTX


def _term_unblocked(target: Callable[..., None], args: tuple[Any, ...]) -> None:
    """A forkserver child: TERM is its own again (the forkserver blocks it: rank_preload; one sent while it
    was blocked arrives now)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    target(*args)


def _noop() -> None:
    pass


def start_rank_server() -> None:
    """Start the forkserver now (and wait until it, or the node's rank server, has imported everything), not at
    the first fragment."""
    _run_child(_noop)


_CHILDREN = threading.Lock()
"""Threads of one process start and reap forkserver children in turn. CPython's are not thread-safe: a
``Process.start`` reaps every other live child (``multiprocessing.process._cleanup``), and of two threads that
read one child's exit status at once, the loser reads EOF and records 255 (a gang's two shares in one process
failed so). Waiting on a child's sentinel needs no turn."""


_SERVED = {"address": os.environ.get(RANK_SERVER_ENV, "")}  # the pilot node's rank server; "" once it failed


def _started(target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess | ServedProcess:
    """A started child running ``target(*args)``: the node's rank server's where the pilot started one
    (rank_server), else (none, or it has gone) this process's forkserver's."""
    if address := _SERVED["address"]:
        try:
            return ServedProcess(address, target, args)
        except RankServerGone as e:
            _SERVED["address"] = ""
            print(f"parsl-bft: {e}; ranks start from this worker's own forkserver from now on", file=sys.stderr)
    p = _rank_context().Process(target=_term_unblocked, args=(target, args), daemon=False)
    with _CHILDREN:
        p.start()
    return p


def _exitcode(p: BaseProcess | ServedProcess) -> int | None:
    with _CHILDREN:
        return p.exitcode


def _join(p: BaseProcess | ServedProcess) -> int:
    wait_any([p.sentinel])
    with _CHILDREN:
        p.join()
    assert p.exitcode is not None     # joined
    return p.exitcode


def _run_child(target: Callable[..., None], *args: Any) -> int:
    """Run ``target(*args)`` in a child of the forkserver (or of the node's rank server); its exit status."""
    return _join(_started(target, args))


def _die_with_forkserver() -> None:
    """A rank must not outlive the worker that launched it: when a pilot's worker pool exits (its interchange is
    gone, it is killed), the forkserver exits with its worker and the kernel SIGKILLs the ranks it forked.
    Orphans would otherwise train on, unseen, or hang in a collective - and escape a batch job's process
    tracking where that follows the process tree (proctrack/linuxproc). Linux only; elsewhere a no-op."""
    from multiprocessing import forkserver

    # every forkserver child gets a copy of the write end of the pipe whose EOF tells the forkserver that its
    # worker is gone (CPython's forkserver passes it on for nested use): while a rank holds it, the forkserver
    # never sees its worker die. A rank that starts processes of its own makes its own forkserver.
    # Both names are CPython's own (tests/unit/test_upstream_contracts.py checks they still exist): read directly,
    # so a rename fails here rather than silently letting ranks outlive their worker.
    fs: Any = forkserver._forkserver
    if fs._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(fs._forkserver_alive_fd)
        fs._forkserver_alive_fd = None
    signal_on_parent_death(signal.SIGKILL)


def _rank_entry(cfg_file: str, env: dict[str, str], log_path: str, job_dir: str, fragment: str, rank: int) -> None:
    _die_with_forkserver()
    adopt_orphans()         # what the loop starts stays below the rank, whatever its session and environment
    os.environ.clear()
    os.environ.update(env)
    output_to_log(log_path, int(env.get("PARSL_BFT_RANK_LOG_MAX", LOG_MAX)))
    from .fragment import main  # the forkserver has it imported already (rank_preload)

    try:
        main(["--config", cfg_file])
    except BaseException as e:          # torch.distributed.elastic's @record: the launcher names who failed first
        JobDir(job_dir).record_error(fragment, rank, e)
        raise
    finally:
        kill_descendants()              # nothing the loop started outlives its rank


class _Rank:
    """One rank process (from the forkserver or the node's rank server), with the few Popen-like calls the
    launcher uses."""

    def __init__(self, cfg_file: str, env: dict[str, str], log_path: str, job_dir: str, fragment: str,
                 rank: int) -> None:
        self.p = _started(_rank_entry, (cfg_file, env, log_path, job_dir, fragment, rank))
        assert self.p.pid is not None           # started
        self.pid: int = self.p.pid
        self.sentinel = self.p.sentinel       # readable once the process has ended

    def poll(self) -> int | None:
        """The exit code (negative: the signal that ended it), or None while it runs."""
        return _exitcode(self.p)

    def send_signal(self, sig: int) -> None:
        """``sig`` to the rank, unless it has already gone."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    def wait(self) -> None:
        """Until it has exited."""
        _join(self.p)
