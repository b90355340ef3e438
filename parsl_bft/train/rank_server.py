"""A pilot node's rank server: it imports torch and the fragment code while Parsl's worker pool starts, instead
of after it. A worker's own rank forkserver (launcher._rank_context) starts only once the pool has started its
manager and its worker; on two loaded cores that is ~3.5 s of Parsl and then ~4.5 s of torch, one after the
other, on every pilot's way to its first fragment. Started with the pool, the two overlap.

    python3 -P -m parsl_bft.train.rank_server -- process_worker_pool.py ARGS...

(the pilot's launch command, execution/site_runtime.py) forks the server and execs the command in its own
place: the pool keeps the pid the pilot's script waits on and signals. ``ENV`` names the server's socket for the
pool's workers, whose launcher starts ranks here (``ServedProcess``) and falls back to its own forkserver if
this server is gone. Each child is a multiprocessing child forked here, so it starts and exits as a
forkserver's child does (the wire format: rank_client.py).

The scheduler ending a pilot sends TERM to its whole process group: to the ranks it is the notice to save at the
end of their step. The server blocks it, so its children (who die with it: the parent-death signal) get to
save. It lives until the pool has gone (its own parent-death signal), then tells its children to stop (TERM),
gives them ``grace_s`` and kills what is left; a child whose launcher has gone (its connection closed) is told
and killed the same way. The pilot's script kills the whole group at the scheduler's grace anyway."""
from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from ..parent_death import signal_on_parent_death
from .rank_client import ENV, INT, read_exact, read_int, socket_name

LAUNCH = "python3 -P -m parsl_bft.train.rank_server --"    # put before a pilot's worker pool command
REQUEST_MAX = 1 << 20
GRACE_S = 30.0                  # Slurm's default KillWait: how long a child told to stop has to save
PARENT_GONE = signal.SIGHUP     # the server's parent-death signal: handled, it only wakes the loop


def _own_user(conn: socket.socket) -> bool:
    """Is the peer this process's user? (The kernel says: SO_PEERCRED.)"""
    creds = struct.Struct("3i")
    _, uid, _ = creds.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, creds.size))
    return bool(uid == os.getuid())


class _Server:
    """The children started and their clients; the deadlines of those told to stop."""

    def __init__(self, listener: socket.socket, parent: int, grace_s: float) -> None:
        self.listener, self.parent, self.grace_s = listener, parent, grace_s
        self.sel = selectors.DefaultSelector()
        self.running: dict[int, tuple[BaseProcess, socket.socket]] = {}     # sentinel -> (child, its client)
        self.kill_at: dict[int, float] = {}                                 # sentinel -> when it is killed
        self.draining = False
        # any signal handled here writes a byte to ``wake``: the parent-death signal wakes the loop
        self.wake, self._waker = socket.socketpair()     # kept: a closed waker's number goes to a client
        self._waker.setblocking(False)
        self._fds = [listener.fileno(), self.wake.fileno(), self._waker.fileno()]
        signal.set_wakeup_fd(self._waker.fileno())
        signal.signal(PARENT_GONE, lambda *_: None)

    def serve(self) -> None:
        """Start a child for every connection until the pool has gone, then until its children have."""
        from . import rank_preload  # noqa: F401  (torch, the fragment code: once here, not in every rank)

        self.sel.register(self.listener, selectors.EVENT_READ)
        self.sel.register(self.wake, selectors.EVENT_READ)
        while not self.draining or self.running:
            now = time.monotonic()
            for key, _ in self.sel.select(max(0.0, min(self.kill_at.values()) - now) if self.kill_at else None):
                if key.fileobj is self.listener:
                    self.start_child()
                elif key.fileobj is self.wake:
                    self.wake.recv(4096)
                elif isinstance(key.fileobj, socket.socket):     # the client spoke or went: its child goes
                    self.sel.unregister(key.fileobj)
                    self._stop(key.data)
                else:
                    self.child_ended(int(key.fd))
            for sentinel in [s for s, t in self.kill_at.items() if t <= time.monotonic()]:
                _signal(self.running[sentinel][0], signal.SIGKILL)      # its sentinel ends it here
                del self.kill_at[sentinel]
            if not self.draining and os.getppid() != self.parent:
                self._drain()

    def _stop(self, sentinel: int) -> None:
        """TERM (the ranks' notice: save at the end of the step), and SIGKILL ``grace_s`` later."""
        if sentinel in self.kill_at or sentinel not in self.running:
            return
        _signal(self.running[sentinel][0], signal.SIGTERM)
        self.kill_at[sentinel] = time.monotonic() + self.grace_s

    def _drain(self) -> None:
        """The pool has gone: no more children; those running are told to stop."""
        self.draining = True
        self.sel.unregister(self.listener)
        self.listener.close()
        for sentinel in list(self.running):
            self._stop(sentinel)

    def start_child(self) -> None:
        """Accept a connection and start the child it asks for (a request it cannot serve is refused)."""
        import multiprocessing as mp

        conn, _ = self.listener.accept()
        try:
            conn.settimeout(10.0)
            if not _own_user(conn):
                raise OSError("a connection from another user")
            size = read_int(conn)
            data = read_exact(conn, size) if size is not None and 0 <= size <= REQUEST_MAX else None
            if data is None:
                raise OSError("no request")
            target, args, cwd = pickle.loads(data)
            # the child must not keep its siblings' connections open: a client learns its child ended from EOF too
            fds = [*self.child_fds(), conn.fileno()]
            p = mp.get_context("fork").Process(target=_child, args=(fds, cwd, target, args), daemon=False)
            p.start()
            conn.settimeout(None)
            conn.sendall(INT.pack(p.pid))
        except Exception as e:           # the server serves on
            print(f"parsl-bft rank server: a request failed: {e!r}", file=sys.stderr, flush=True)
            conn.close()
            return
        self.running[p.sentinel] = (p, conn)
        self.sel.register(p.sentinel, selectors.EVENT_READ)
        self.sel.register(conn, selectors.EVENT_READ, p.sentinel)

    def child_ended(self, sentinel: int) -> None:
        """Tell its client the exit code (multiprocessing's: negative, the signal that ended it)."""
        p, conn = self.running.pop(sentinel)
        self.kill_at.pop(sentinel, None)
        self.sel.unregister(sentinel)
        p.join()
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        with contextlib.suppress(OSError):          # a client that has gone hears nothing
            conn.sendall(INT.pack(p.exitcode if p.exitcode is not None else -signal.SIGKILL))
        conn.close()
        p.close()

    def child_fds(self) -> list[int]:
        """What a new child must close: the server's own sockets and the other children's connections."""
        return [*self._fds, *(c.fileno() for _, c in self.running.values())]


def _signal(p: BaseProcess, sig: int) -> None:
    if p.pid is not None:                       # started
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)


def _child(fds: list[int], cwd: str, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(PARENT_GONE, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal_on_parent_death(signal.SIGKILL)  # nothing the server started outlives it (nor, so, the pilot's pool)
    with contextlib.suppress(OSError):      # the worker's folder, as a forkserver child of the worker has
        os.chdir(cwd)
    target(*args)


def start(command: list[str], grace_s: float = GRACE_S) -> NoReturn:
    """Fork the server, then become ``command`` with ``ENV`` naming the server's socket."""
    # Linux's abstract namespace: nothing on disk to leave behind when the server is killed. It has no file
    # permissions: the server serves its own user only (_own_user)
    address = f"@parsl-bft-ranks-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_name(address))   # bound before the fork: a worker that asks early waits for the import
    listener.listen(64)
    parent = os.getpid()
    if os.fork() == 0:
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)    # as CPython's forkserver: a terminal's Ctrl-C is the ranks'
            # the scheduler's TERM to the group is the ranks' notice, not the server's end. Blocked, not ignored:
            # a child inherits the mask, and a TERM sent before it unblocks waits for it instead of being lost
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            server = _Server(listener, parent, grace_s)
            signal_on_parent_death(PARENT_GONE)             # the pool (this pid, after exec) gone: drain and go
            server.serve()
            code = 0
        except BaseException:               # the workers' launchers fall back to their own forkservers
            traceback.print_exc()
        finally:
            os._exit(code)
    listener.close()
    os.environ[ENV] = address
    os.execvp(command[0], command)


def main(argv: list[str]) -> NoReturn:
    """``python -m parsl_bft.train.rank_server [--grace SECONDS] -- COMMAND [ARGS...]``: ``start(COMMAND)``."""
    grace_s = GRACE_S
    if argv[:1] == ["--grace"] and len(argv) > 1:
        try:
            grace_s = float(argv[1])
        except ValueError:
            sys.exit(f"rank server: --grace takes seconds, got {argv[1]!r}")
        argv = argv[2:]
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.exit("usage: python -m parsl_bft.train.rank_server [--grace SECONDS] -- COMMAND [ARGS...]")
    start(argv[1:], grace_s)


if __name__ == "__main__":
    main(sys.argv[1:])
