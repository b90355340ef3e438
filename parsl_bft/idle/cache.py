"""A cache of parsed job logs: reading an SWF log, replaying its schedule (FCFS + EASY for ``--schedule easy``) and
assigning nodes costs tens of CPU-seconds on a large log; every later command on the same file with the same
options reads the result back instead.

The key is the file (its resolved path, size and modification time), the options that shape the result, and the
code that builds it (a digest of the ``parsl_bft.idle`` sources): a changed file or a new parser never reads an
old entry. Warnings the first load gave (skipped rows, starts over capacity) are given again on every hit.
Where: ``$PARSL_BFT_CACHE`` (a folder; ``off`` turns the cache off), else ``$XDG_CACHE_HOME/parsl-bft``, else
``~/.cache/parsl-bft``. A cache that cannot be read or written is passed over silently (the log is parsed).
A pickle runs code as it is read: the folder and every entry must be the user's own and writable by nobody else
(OpenSSH's rule); one that is not is passed over with a warning.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import secrets
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar

from ..owned import link_of_another, untrusted

T = TypeVar("T")
ENV = "PARSL_BFT_CACHE"


def cache_dir() -> Path | None:
    """The cache folder, or None when ``$PARSL_BFT_CACHE`` is ``off``."""
    env = os.environ.get(ENV, "")
    if env.lower() == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parsl-bft"


@cache
def _code_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def cache_key(path: str | Path, options: dict[str, object]) -> str | None:
    """The entry's name for ``path`` read with ``options`` (None: the file cannot be looked at)."""
    try:
        p = Path(path).resolve()
        st = p.stat()
    except OSError:
        return None
    text = repr((str(p), st.st_size, st.st_mtime_ns, sorted(options.items()), _code_digest()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached(path: str | Path, options: dict[str, object], build: Callable[[], T]) -> T:
    """``build()``'s result for ``path`` and ``options``: from the cache when it holds it, else built and kept."""
    folder, key = cache_dir(), cache_key(path, options)
    if folder is None or key is None:
        return build()
    fd = _open_folder(folder)
    if fd is None:
        return build()
    try:
        return _through(fd, folder, f"{key}.pickle", build)
    finally:
        os.close(fd)


def _through(fd: int, folder: Path, name: str, build: Callable[[], T]) -> T:
    """The entry ``name`` of the open cache folder ``fd``, if there and trusted; else built and kept there."""
    got = _read(fd, folder, name)
    if got is not None:
        value, said = got
        for message, category in said:
            warnings.warn(message, category, stacklevel=3)
        return value        # type: ignore[return-value]   # what build() gave when it was kept
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = build()
    said = [(str(w.message), w.category) for w in caught]
    for message, category in said:
        warnings.warn(message, category, stacklevel=3)
    _write(fd, name, (value, said))
    return value


def _distrust(what: Path, why: str) -> None:
    warnings.warn(f"the parse cache's {what} {why}: not used (the log is parsed again); set {ENV} to a folder of "
                  "your own that only you can write", stacklevel=5)


def _open_folder(folder: Path) -> int | None:
    """The cache folder (made 0700 if missing), open - if it is to be trusted: the user's own, writable by nobody
    else, not a link another user made (a pickle another user can put there runs as this user when read). None:
    not usable (passed over silently) or not trusted (a warning)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    why = untrusted(os.fstat(fd)) or ("is a symbolic link another user made" if link_of_another(folder) else None)
    if why:
        os.close(fd)
        _distrust(folder, why)
        return None
    return fd


def _read(fd: int, folder: Path, name: str) -> tuple[object, list[tuple[str, type[Warning]]]] | None:
    """An entry of the open folder ``fd``, unpickled only if the file is the user's own and nobody else's to
    write (checked on the file opened, no link followed); None: missing, unreadable or not trusted."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(f, "rb") as fh:
        why = untrusted(os.fstat(f))
        if why:
            _distrust(folder / name, why)
            return None
        try:
            value, said = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, ImportError):
            return None
    return value, said


def _write(fd: int, name: str, data: object) -> None:
    """Keep ``data`` as ``name`` in the open folder ``fd``: written under a fresh name made exclusively (0600,
    no link followed), then renamed - a reader never sees half a file."""
    tmp = f".tmp-{secrets.token_hex(8)}.pickle"
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                               dir_fd=fd), "wb") as f:
            pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
