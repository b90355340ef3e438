"""A cache of parsed job logs: reading an SWF log, replaying its schedule (FCFS + EASY for ``--schedule easy``) and
assigning nodes costs tens of CPU-seconds on a large log; every later command on the same file with the same
options reads the result back instead.

The key is the file (its resolved path, size and modification time), the options that shape the result, and the
code that builds it (a digest of the ``parsl_bft.idle`` sources): a changed file or a new parser never reads an
old entry. Warnings the first load gave (skipped rows, starts over capacity) are given again on every hit.
Where: ``$PARSL_BFT_CACHE`` (a folder; ``off`` turns the cache off), else ``$XDG_CACHE_HOME/parsl-bft``, else
``~/.cache/parsl-bft``. A cache that cannot be read or written is passed over silently (the log is parsed).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar

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
    entry = folder / f"{key}.pickle"
    try:
        with open(entry, "rb") as f:
            value, said = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, ImportError):
        pass
    else:
        for message, category in said:
            warnings.warn(message, category, stacklevel=2)
        return value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = build()
    said = [(str(w.message), w.category) for w in caught]
    for message, category in said:
        warnings.warn(message, category, stacklevel=2)
    _write(entry, (value, said))
    return value


def _write(entry: Path, data: object) -> None:
    """Keep ``data`` at ``entry`` (written aside, then renamed: a reader never sees half a file)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".pickle")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass
