"""Parsl configurations parsl-bft builds, and their source code. The embedded default runs everything on the
local machine."""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import types
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BadValue
from ..safe_python import python_command

if TYPE_CHECKING:
    from parsl.config import Config

LOCAL_LABEL = "bft_local"


def ensure_venv_on_path() -> None:
    """HTEX starts interchange.py and process_worker_pool.py by name: the running Python's bin/ must be on PATH."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def interchange_dies_with_us() -> list[str]:
    """HTEX's ``interchange_launch_cmd``: the interchange ends when the process that started it does
    (``die_with_parent``), so a killed orchestrator leaves no interchange, worker pool or rank behind. The
    watcher starts with a safe ``sys.path`` (never importing from the current folder), the interchange by its
    path next to this Python where it is there (not whatever ``interchange.py`` comes first on PATH)."""
    beside = Path(sys.executable).parent / "interchange.py"
    return python_command("-m", "parsl_bft.execution.die_with_parent",
                          str(beside) if beside.is_file() else "interchange.py")


def local_config(workers: int = 8, run_dir: str = "runinfo", label: str = LOCAL_LABEL) -> Config:
    """HighThroughputExecutor on a LocalProvider: one block, ``workers`` fragment slots. Parsl retries are off:
    a reclaimed or failed fragment is a normal event the orchestrator handles (resume from the checkpoint)."""
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    ensure_venv_on_path()
    return Config(
        executors=[HighThroughputExecutor(label=label, address="127.0.0.1", max_workers_per_node=workers,
                                          # a worker only waits for its fragment's rank processes: do not let
                                          # the core count (cores_per_worker=1) cap the number of fragment slots
                                          cores_per_worker=0.01,
                                          cpu_affinity="none", heartbeat_period=2, heartbeat_threshold=10,
                                          interchange_launch_cmd=interchange_dies_with_us(),
                                          provider=LocalProvider(  # type: ignore[no-untyped-call]
                                              init_blocks=1, min_blocks=1, max_blocks=1))],
        # the one block is launched at the job status poller's first turn: after strategy_period (default 5 s
        # of a run's start-up); its later turns only read the block's status, at the provider's own interval
        run_dir=run_dir, retries=0, strategy="none", strategy_period=0.5, initialize_logging=False,
    )


# --- a Config as source code ------------------------------------------------------------------------------
# Parsl's Config, executors and providers are RepresentationMixin: their repr is the constructor call. What
# repr cannot write as code is filled in here: functions (block_error_handler), stateless helper objects
# (manager_selector) and objects whose construction the builder recorded because their class has no code
# repr of its own.

_CONSTRUCTED: weakref.WeakKeyDictionary[Any, tuple[type, dict[str, Any]]] = weakref.WeakKeyDictionary()
_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-f]+>")


T = TypeVar("T")


def constructed(obj: T, cls: type | None = None, **kwargs: Any) -> T:
    """Remember that ``obj`` is ``cls(**kwargs)`` (default: its own class), for ``config_source``. Returns obj."""
    _CONSTRUCTED[obj] = (cls or type(obj), kwargs)
    return obj


def config_source(config: Config, comment: str = "") -> str:
    """Python code (imports, then ``config = ...``) that builds an equivalent Config: the Config's own repr."""
    imports: set[tuple[str, str]] = set()
    subst: dict[str, str] = {}
    _collect(config, imports, subst, set())
    text = repr(config)
    for old, new in subst.items():
        text = _replace_indented(text, old, new)
    if left := _ADDRESS.findall(text):
        raise BadValue(f"no code for {', '.join(sorted(set(left)))}: make its class RepresentationMixin")
    by_module: dict[str, list[str]] = {}
    for m, n in sorted(imports):
        by_module.setdefault(m, []).append(n)
    head = "\n".join(f"from {m} import {', '.join(ns)}" for m, ns in by_module.items())
    return f"{head}\n\n{comment}config = {text}\n"


def _collect(obj: Any, imports: set[tuple[str, str]], subst: dict[str, str], seen: set[int]) -> None:
    from parsl.utils import RepresentationMixin

    if isinstance(obj, (str, bytes, int, float, bool, type(None), Path)) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple, set, frozenset)):
        for x in obj:
            _collect(x, imports, subst, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            _collect(x, imports, subst, seen)
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
        imports.add(_importable(obj))
        subst[repr(obj)] = obj.__name__
    elif _has_own_repr(obj):                 # its own repr wins over a recorded construction
        imports.add(_importable(type(obj)))
        if isinstance(obj, RepresentationMixin):
            for name in _init_args(type(obj)):
                _collect(getattr(obj, name, None), imports, subst, seen)
    elif _is_constructed(obj):
        cls, kwargs = _CONSTRUCTED[obj]
        imports.add(_importable(cls))
        for v in kwargs.values():
            _collect(v, imports, subst, seen)
        subst[repr(obj)] = _call(cls.__name__, kwargs)
    elif not vars(obj):                      # no state: a fresh instance is the same thing
        imports.add(_importable(type(obj)))
        subst[repr(obj)] = f"{type(obj).__name__}()"


def _has_own_repr(obj: Any) -> bool:
    return type(obj).__repr__ is not object.__repr__  # type: ignore[comparison-overlap]


def _is_constructed(obj: Any) -> bool:
    try:
        return obj in _CONSTRUCTED
    except TypeError:                        # unhashable or not weak-referenceable
        return False


def _init_args(cls: type) -> list[str]:
    """The constructor arguments RepresentationMixin prints (it reads them back as attributes)."""
    init = cls.__init__  # type: ignore[misc]
    init = getattr(init, "__wrapped__", init)
    spec = inspect.getfullargspec(init)
    return spec.args[1:] + spec.kwonlyargs


def _importable(obj: Any) -> tuple[str, str]:
    """(module, name) to import obj from: the shortest public parent package that exports it."""
    mod, name = obj.__module__, obj.__name__
    parts = mod.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        try:
            if getattr(importlib.import_module(parent), name, None) is obj:
                return parent, name
        except ImportError:
            continue
    return mod, name


def _call(name: str, kwargs: dict[str, Any]) -> str:
    """``name(k=v, ...)`` as RepresentationMixin writes it: one line if short, else one argument a line."""
    line = f"{name}({', '.join(f'{k}={v!r}' for k, v in sorted(kwargs.items()))})"
    if len(line) <= 80:
        return line
    return name + "(" + ", ".join(f"\n    {k}={v!r}" for k, v in sorted(kwargs.items())) + "\n)"


def _replace_indented(text: str, old: str, new: str) -> str:
    """Replace old by new, indenting new's later lines like the line old stands on."""
    def sub(m: re.Match[str]) -> str:
        line = text[text.rfind("\n", 0, m.start()) + 1:]
        indent = line[:len(line) - len(line.lstrip(" "))]
        return new.replace("\n", "\n" + indent)
    return re.sub(re.escape(old), sub, text)
