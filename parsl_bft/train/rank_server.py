"""A pilot node's rank server: it imports torch and the fragment code while Parsl's worker pool starts, instead
of after it. A worker's own rank forkserver (launcher._rank_context) starts only once the pool has started its
manager and its worker; on two loaded cores that is ~3.5 s of Parsl and then ~4.5 s of torch, one after the
other, on every pilot's way to its first fragment. Started with the pool, the two overlap.

    python3 -P -m parsl_bft.train.rank_server -- process_worker_pool.py ARGS...

(the pilot's launch command, execution/site_runtime.py) forks the server and execs the command in its own
place: the pool keeps the pid the pilot's script waits on and signals. ``ENV`` names the server's socket for the
pool's workers, whose launcher starts ranks here (``ServedProcess``) and falls back to its own forkserver if
this server is gone. The server dies with the pool (the parent-death signal) and its children with it; a
child whose launcher has gone (its connection closed) is killed. Each child is a multiprocessing child forked
here, so it starts and exits as a forkserver's child does (the wire format: rank_client.py)."""
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
import traceback
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from ..parent_death import signal_on_parent_death
from .rank_client import ENV, INT, read_exact, read_int, socket_name

LAUNCH = "python3 -P -m parsl_bft.train.rank_server --"    # put before a pilot's worker pool command
REQUEST_MAX = 1 << 20


def _own_user(conn: socket.socket) -> bool:
    """Is the peer this process's user? (The kernel says: SO_PEERCRED.)"""
    creds = struct.Struct("3i")
    _, uid, _ = creds.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, creds.size))
    return bool(uid == os.getuid())


def serve(listener: socket.socket) -> NoReturn:
    """Import what ranks need, then start a child for every connection, until this process is killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # as CPython's forkserver: a terminal's Ctrl-C is the ranks'
    from . import rank_preload  # noqa: F401  (torch, the fragment code: once here, not in every rank)

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    running: dict[int, tuple[BaseProcess, socket.socket]] = {}     # sentinel -> (child, its client)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                _start_child(listener, sel, running)
            elif isinstance(key.fileobj, socket.socket):     # the client spoke or went: its child goes
                sel.unregister(key.fileobj)
                p = key.data
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
            else:
                _child_ended(int(key.fd), sel, running)


def _start_child(listener: socket.socket, sel: selectors.BaseSelector,
                 running: dict[int, tuple[BaseProcess, socket.socket]]) -> None:
    import multiprocessing as mp

    conn, _ = listener.accept()
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
        others = [listener.fileno(), *(c.fileno() for _, c in running.values()), conn.fileno()]
        p = mp.get_context("fork").Process(target=_child, args=(others, cwd, target, args), daemon=False)
        p.start()
        conn.settimeout(None)
        conn.sendall(INT.pack(p.pid))
    except Exception as e:           # a request it cannot serve is refused; the server serves on
        print(f"parsl-bft rank server: a request failed: {e!r}", file=sys.stderr, flush=True)
        conn.close()
        return
    running[p.sentinel] = (p, conn)
    sel.register(p.sentinel, selectors.EVENT_READ)
    sel.register(conn, selectors.EVENT_READ, p)


def _child_ended(sentinel: int, sel: selectors.BaseSelector,
                 running: dict[int, tuple[BaseProcess, socket.socket]]) -> None:
    p, conn = running.pop(sentinel)
    sel.unregister(sentinel)
    p.join()
    with contextlib.suppress(KeyError, ValueError):
        sel.unregister(conn)
    with contextlib.suppress(OSError):          # a client that has gone hears nothing
        conn.sendall(INT.pack(p.exitcode if p.exitcode is not None else -signal.SIGKILL))
    conn.close()
    p.close()


def _child(fds: list[int], cwd: str, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal_on_parent_death(signal.SIGKILL)  # nothing the server started outlives it (nor, so, the pilot's pool)
    with contextlib.suppress(OSError):      # the worker's folder, as a forkserver child of the worker has
        os.chdir(cwd)
    target(*args)


def start(command: list[str]) -> NoReturn:
    """Fork the server, then become ``command`` with ``ENV`` naming the server's socket."""
    # Linux's abstract namespace: nothing on disk to leave behind when the server is killed. It has no file
    # permissions: the server serves its own user only (_own_user)
    address = f"@parsl-bft-ranks-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_name(address))   # bound before the fork: a worker that asks early waits for the import
    listener.listen(64)
    if os.fork() == 0:
        try:
            signal_on_parent_death(signal.SIGKILL)      # the pool (this pid, after exec) gone: so is the server
            serve(listener)
        except BaseException:               # the workers' launchers fall back to their own forkservers
            traceback.print_exc()
        finally:
            os._exit(1)
    listener.close()
    os.environ[ENV] = address
    os.execvp(command[0], command)


def main(argv: list[str]) -> NoReturn:
    """``python -m parsl_bft.train.rank_server -- COMMAND [ARGS...]``: ``start(COMMAND)``."""
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.exit("usage: python -m parsl_bft.train.rank_server -- COMMAND [ARGS...]")
    start(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
