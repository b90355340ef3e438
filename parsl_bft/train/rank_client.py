"""The launcher's side of a pilot node's rank server (rank_server.py): a child the server started, as the
launcher sees it, and the wire format. One connection per child: the client sends a pickled (target, args, cwd);
the server answers the child's pid, then its exit code (multiprocessing's: negative for a signal), each an
8-byte signed int."""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
from collections.abc import Callable
from typing import Any

from ..errors import ParslBftError

ENV = "PARSL_BFT_RANK_SERVER"        # the server's socket, in the environment of the pool it started with
INT = struct.Struct("!q")
START_TIMEOUT_S = 300.0     # a server still importing torch from a slow parallel file system answers late


class RankServerGone(ParslBftError):
    """The rank server did not start a child (it exited, or never started)."""


class ServedProcess:
    """A child of the rank server, with the part of multiprocessing's Process the launcher uses: ``pid``,
    ``sentinel`` (readable once it has exited), ``exitcode`` and ``join``."""

    def __init__(self, address: str, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._code: int | None = None
        self._sock = socket.socket(socket.AF_UNIX)
        try:
            self._sock.settimeout(START_TIMEOUT_S)
            self._sock.connect(socket_name(address))
            self._sock.sendall(_framed(pickle.dumps((target, args, os.getcwd()))))
            pid = read_int(self._sock)
        except OSError as e:
            self._sock.close()
            raise RankServerGone(f"rank server {address}: {e}") from None
        if pid is None:
            self._sock.close()
            raise RankServerGone(f"rank server {address} did not start the child (its output says why)")
        self._sock.settimeout(None)
        self.pid: int = pid
        self.sentinel: int = self._sock.fileno()

    @property
    def exitcode(self) -> int | None:
        """The exit code (negative: the signal that ended it), or None while it runs."""
        if self._code is None and _readable(self._sock):
            self._read_code()
        return self._code

    def join(self) -> None:
        """Until it has exited."""
        if self._code is None:
            self._read_code()

    def _read_code(self) -> None:
        try:
            code = read_int(self._sock)
        except OSError:
            code = None
        # no answer: the server died, and its children with it (their parent-death signal)
        self._code = -signal.SIGKILL if code is None else code

    def __del__(self) -> None:
        # open until now: the sentinel stays a valid descriptor (EOF) for whoever waits on it after the exit code
        # was read. Closed before the child ended, it tells the server to kill the child
        self._sock.close()


def socket_name(address: str) -> str:
    """``ENV``'s form of an abstract socket's name (an environment variable cannot hold its leading NUL)."""
    return "\0" + address[1:] if address.startswith("@") else address


def _readable(sock: socket.socket) -> bool:
    poll = select.poll()        # no descriptor of its own (a selector's epoll would be one per look)
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


def _framed(data: bytes) -> bytes:
    """``data`` preceded by its length."""
    return INT.pack(len(data)) + data


def read_exact(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``; None if it closed first."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_int(sock: socket.socket) -> int | None:
    """One int of the wire format; None if the peer closed first."""
    data = read_exact(sock, INT.size)
    return None if data is None else int(INT.unpack(data)[0])
