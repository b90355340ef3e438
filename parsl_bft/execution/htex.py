"""The Parsl side of running fragments at one site: its apps, gangs of node shares, placement read back from
the rendezvous store, and warming local workers up. The orchestrator talks to sites only through this."""
from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ParslBftError
from ..train.config import FragmentConfig, FragmentFailed, FragmentResult
from .events import Event, WarmUpFailed
from .pool import SitePool

if TYPE_CHECKING:
    from ..train.launcher import RendezvousStore


def interchange_gone(label: str) -> bool:
    """Whether the loaded DataFlowKernel's executor ``label`` had an interchange that has exited (it runs under
    ``die_with_parent``, which exits with it): that executor can deliver no result and answer no command."""
    import parsl
    from parsl.errors import NoDataFlowKernelError

    try:
        return _exited(parsl.dfk().executors.get(label))
    except NoDataFlowKernelError:
        return False


def release_dead_interchanges(dfk: Any) -> list[str]:
    """Executors of ``dfk`` whose interchange has exited cannot answer their command channel, and a command to it
    blocks for ever (a ZMQ REQ socket's send waits for a peer): Parsl's job status poller stays stuck there and
    the DataFlowKernel's cleanup joins that poller - a run that was told to stop hung until SIGKILL. A stand-in
    peer (``_StandIn``) answers in the interchange's place, with nothing connected, so a blocked command returns;
    the executor is marked bad, so the cleanup does not scale its blocks in through that channel. Its tasks'
    futures are left alone: the orchestrator decides about its fragments (``Fragments.unreachable``), whose
    ranks may still be saving. Returns those executors' labels."""
    gone = []
    for label, ex in dfk.executors.items():
        client = getattr(ex, "command_client", None)
        if client is None or not _exited(ex) or getattr(ex, "_bft_stand_in", None) is not None:
            continue
        gone.append(label)
        # Parsl's own flag (set_bad_state_and_fail_all would also fail every task: ranks still saving would be
        # collected as failed and killed); private names, checked by tests/unit/test_upstream_contracts.py
        ex._executor_exception = RuntimeError(f"executor {label}: its interchange has exited")
        ex._executor_bad_state.set()
        host = "127.0.0.1" if client.ip_address in ("*", "0.0.0.0", "::") else client.ip_address  # bound on all
        ex._bft_stand_in = _StandIn(f"tcp://{host}:{client.port}", getattr(ex, "cert_dir", None))
    return gone


class _StandIn(threading.Thread):
    """A REP peer on a dead interchange's command channel: every command gets the answer of an interchange with
    no worker connected (its own socket, on its own thread: ZMQ sockets are not shared between threads)."""

    ANSWERS: ClassVar[dict[str, Any]] = {"CONNECTED_BLOCKS": [], "MANAGERS": [], "MANAGERS_PACKAGES": {}, "WORKERS": 0,
                               "OUTSTANDING_C": 0}

    def __init__(self, url: str, cert_dir: str | None) -> None:
        super().__init__(name="bft-interchange-stand-in", daemon=True)
        self.url, self.cert_dir = url, cert_dir
        self.start()

    def run(self) -> None:
        import zmq
        import zmq.auth

        ctx = zmq.Context()
        sock = ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        if self.cert_dir:                 # the channel is CurveZMQ: answer as the interchange's server key
            public, secret = zmq.auth.load_certificate(os.path.join(self.cert_dir, "server.key_secret"))
            sock.curve_publickey, sock.curve_secretkey, sock.curve_server = public, secret, True
        sock.connect(self.url)
        while True:                       # until the process ends (a daemon thread)
            command = sock.recv_pyobj()
            sock.send_pyobj(self.ANSWERS.get(command) if isinstance(command, str) else None)


def _exited(ex: Any) -> bool:
    """An (HTEX) executor whose interchange was started and has exited."""
    proc = getattr(ex, "interchange_proc", None)
    return proc is not None and proc.poll() is not None


class FragmentAbandoned(RuntimeError):
    """Shares of a gang given up before they started (their nodes were reclaimed while they waited for a worker)."""


class FragmentLost(RuntimeError):
    """A gang collected before its executor noticed: every node its shares ran on has left."""


class FragmentHandle:
    """A launched fragment: one Parsl future per node share (or one for all ranks). Done only when EVERY
    share has ended or was given up - a failed share's peers may still be saving or holding the rendezvous.

    A gang's share waits in its lane's interchange until a worker of that group is free. If the group's pilots
    are reclaimed first, it would wait for a new pilot there (a minute or more) while the job trains nowhere:
    ``abandon`` gives such shares up. Each share claims its start in the rendezvous store before it runs
    (``launcher.run_gang_task``) and one given up never runs, even if a worker picks its task up later - it would
    train beside the job's next fragment."""

    def __init__(self, futures: list[Future[Any]], store: RendezvousStore | None = None, fragment: str = "") -> None:
        self.futures, self.store, self.fragment = futures, store, fragment
        self.abandoned: set[int] = set()

    def abandon(self, all_or_none: bool = False) -> int:
        """Give up the shares that have not started; ``all_or_none``: only if none has. Returns how many."""
        if self.store is None:
            return 0
        keys = {i: f"{self.fragment}/share/{i}" for i, f in enumerate(self.futures)
                if i not in self.abandoned and not f.done()}
        if all_or_none and (len(keys) < len(self.futures) or any(self.store.check([k]) for k in keys.values())):
            return 0
        given_up = {i for i, k in keys.items() if self.store.compare_set(k, "", "abandoned") == b"abandoned"}
        self.abandoned |= given_up
        return len(given_up)

    def done(self) -> bool:
        """Every share has ended or was given up."""
        return all(f.done() or i in self.abandoned for i, f in enumerate(self.futures))

    def result(self) -> FragmentResult:
        """The fragment's result (from rank 0's share); a failed share's error, or FragmentAbandoned."""
        for i, f in enumerate(self.futures):
            exc = f.exception() if i not in self.abandoned else None
            if exc is not None:
                raise exc
        if self.abandoned:
            raise FragmentAbandoned(f"fragment {self.fragment}: node shares {sorted(self.abandoned)} never started "
                                    "(their nodes were reclaimed while they waited for a worker)")
        res: FragmentResult | None = self.futures[0].result()
        if res is None:            # share 0 runs rank 0: it reports or fails
            raise FragmentFailed(f"fragment {self.fragment}: rank 0's share returned no result")
        return res


class SiteRunner:
    """One site's way of running fragments: its Parsl apps (per lane on pilots), bound to its executor(s)."""

    def __init__(self, name: str, site: SitePool, store: RendezvousStore) -> None:
        from parsl import python_app

        from .apps import fragment_task
        self.name, self.site, self.store = name, site, store
        self.gang = site.pool.gang
        self.addr = store.address(store_host(site.executor, self.gang))     # SECRET@HOST:PORT
        self._app = python_app(fragment_task, executors=[site.executor])     # all ranks in one task
        self._apps: dict[tuple[str, str], Callable[..., Future[Any]]] = {}

    def _app_on(self, fn: Callable[..., Any], node: str) -> Callable[..., Future[Any]]:
        """``fn`` as an app of the executor that runs tasks on ``node`` (its group's lane; pools without
        lanes: the site's one executor)."""
        from parsl import python_app

        label = self.site.pool.executor_label(node) or self.site.executor
        key = (fn.__name__, label)
        if key not in self._apps:
            self._apps[key] = python_app(fn, executors=[label])
        return self._apps[key]

    def launch(self, cfg: FragmentConfig, nodes: tuple[str, ...]) -> FragmentHandle:
        """Run a fragment on the planned ``nodes`` (the site's own names): a gang's share i goes to where
        ``nodes[i]`` is."""
        if self.gang:
            from .apps import fragment_node_task
            return FragmentHandle([self._app_on(fragment_node_task, n)(cfg, i, self.addr)
                                   for i, n in enumerate(nodes)], self.store, cfg.fragment_id)
        return FragmentHandle([self._app(cfg, self.addr)])

    def prime(self, nodes: list[str]) -> list[Future[str]]:
        """Pilots just joined on ``nodes``: have their fresh workers start the rank forkserver (torch imported)
        before any fragment is planned there. Each future answers with the node it ran on (a lane's task may
        land on any of its workers). Local workers were warmed up at start: nothing to do."""
        if not self.gang:
            return []
        from .apps import warm_up
        return [self._app_on(warm_up, n)("", 1) for n in nodes]

    def placed(self, fragment: str, nodes: int) -> dict[int, str]:
        """node index -> the node its share landed on, for the shares that have said so."""
        keys = {i: f"{fragment}/node/{i}" for i in range(nodes)}
        return {i: self.store.get(k).decode() for i, k in keys.items() if self.store.check([k])}

    def warm_up(self, barrier_dir: Path, log: Callable[[Event], None],
                stop: Callable[[], bool] = lambda: False) -> None:
        """Executors whose workers stay (not pilots): start every worker's rank forkserver before the pool
        does, so no planned node waits seconds for torch to import. Given up as soon as ``stop()`` (a session
        that ends at once, e.g. a re-run of jobs that are all done, does not wait for it)."""
        from parsl import python_app
        from parsl.dataflow.dflow import DataFlowKernelLoader

        from .apps import warm_up
        ex = DataFlowKernelLoader.dfk().executors[self.site.executor]
        if self.gang or not hasattr(ex, "connected_managers"):
            return
        deadline = time.monotonic() + 60
        while not ex.connected_managers() and time.monotonic() < deadline and not stop():
            time.sleep(0.2)
        n = sum(int(m.get("worker_count", 0)) for m in ex.connected_managers())
        app = python_app(warm_up, executors=[self.site.executor])
        futs = [app(str(barrier_dir), n) for _ in range(n)]
        deadline = time.monotonic() + 180
        while not all(f.done() for f in futs) and time.monotonic() < deadline and not stop():
            time.sleep(0.1)
        for f in futs:
            if f.done() and f.exception() is not None:   # only a slower first fragment; nothing is lost
                log(WarmUpFailed(str(f.exception())[:200]))
        shutil.rmtree(barrier_dir, ignore_errors=True)


class InterchangeLost(ParslBftError):
    """A site's Parsl interchange ended: no fragment there can start or report any more, so the run stops (saying
    so) instead of showing the jobs running with no progress."""


def check_run_helpers(store: RendezvousStore | None, sites: dict[str, SitePool]) -> None:
    """The processes a run's fragments depend on, each loop turn: the rendezvous store (``RendezvousLost``; None:
    not started yet) and every site's HTEX interchange started here (``InterchangeLost``; its watcher exits with
    it). A dead one would stall the run: fragments that never start."""
    if store is not None:
        store.check_alive()
    from parsl.dataflow.dflow import DataFlowKernelLoader
    from parsl.errors import NoDataFlowKernelError

    try:
        executors = DataFlowKernelLoader.dfk().executors
    except NoDataFlowKernelError:           # runners of their own (tests): no Parsl executor here
        return
    for name, site in sites.items():
        proc = getattr(executors.get(site.executor), "interchange_proc", None)
        if proc is not None and (code := proc.poll()) is not None:
            raise InterchangeLost(f"site {name or site.executor}: the Parsl interchange (process {proc.pid}) ended "
                                  f"(exit status {code}): no fragment there can start or report; the run stops "
                                  "(run it again: jobs resume from their newest checkpoints)")


def serve_site_store(sites: dict[str, SitePool]) -> RendezvousStore:
    """The run's rendezvous store (``launcher.RendezvousStore``: its own process, a secret), listening where the
    sites' ranks reach it: loopback when they all run on this host, else the interchange address the site file
    names (``bind_host``); sites that reach this host on different addresses: every interface."""
    from ..train.launcher import serve_store

    hosts = {bind_host(s.executor, s.pool.gang) for s in sites.values()}
    return serve_store(hosts.pop() if len(hosts) == 1 else "")


def bind_host(executor_label: str, gang: bool) -> str:
    """Where the store listens for one site's ranks: loopback for local workers; for pilots the address their
    worker pools reach the interchange on, when the site file names one ("": every interface, when Parsl
    probes this host's addresses instead)."""
    return "127.0.0.1" if not gang else _interchange_address(executor_label) or ""


def store_host(executor_label: str, gang: bool) -> str:
    """The address ranks reach the orchestrator's store on: local workers use loopback; pilots the address
    their worker pools reach the interchange on (the site's interchange_address), else this host's name."""
    return "127.0.0.1" if not gang else _interchange_address(executor_label) or socket.getfqdn()


def _interchange_address(executor_label: str) -> str | None:
    """The address the site file gives its executor's interchange (None: Parsl probes this host's)."""
    from parsl.dataflow.dflow import DataFlowKernelLoader
    return getattr(DataFlowKernelLoader.dfk().executors[executor_label], "address", None) or None
