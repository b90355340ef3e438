"""Imported once by the forkserver that training ranks fork from (see launcher._rank_context), so every rank
starts with this already done: torch, the fragment code and its launcher, torch's lazy imports behind
``use_deterministic_algorithms`` (about 800 modules, a second per rank otherwise), and the parent's main module.

The main module: a rank is a multiprocessing child, and multiprocessing re-runs the parent's main script (as
``__mp_main__``) in every child whose ``__main__`` is not that script already. ``set_forkserver_preload
(["__main__"])`` was meant to do that once in the forkserver, but on Python 3.11 and 3.12 it never does (the
forkserver looks for a ``main_path`` key that ``spawn.get_preparation_data`` stopped returning in 3.4; CPython
gh-126631, fixed in later releases), so every rank re-ran a Parsl worker's ``process_worker_pool.py`` (all of
Parsl), pytest's entry script, or a benchmark's imports (scikit-learn: ~1 s a rank on two loaded cores). The
launcher passes what a child's ``spawn.prepare`` gets (sys.path, sys.argv, the main script's path or module
name) in ``MAIN_ENV``; preparing it here once makes every forked rank find its ``__main__`` in place.

Not on a node with GPUs: a main script that asks CUDA anything at import (``torch.cuda.is_available()`` at module
level is common) would initialise the driver here, and ranks forked from here could not use it; there every rank
runs the main script itself, as before."""
import glob
import json
import os
import signal
import sys

import torch

from ..safe_python import forget_safe_path_env
from . import fragment  # noqa: F401  (the ranks' code: imported once here, not per rank)
from .launcher import MAIN_ENV


def _gpu_node() -> bool:
    """NVIDIA or AMD GPUs here (their device files: asking CUDA itself would initialise it)."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")


PARSL_WORKER_MAIN = "process_worker_pool.py"   # a Parsl worker's main script: nothing a rank needs


def _prepare_main() -> None:
    data = json.loads(os.environ.pop(MAIN_ENV, "{}"))
    path = data.get("init_main_from_path")
    if path and os.path.basename(path) == PARSL_WORKER_MAIN:
        # ranks fork from a Parsl worker: its main is all of Parsl (1.5 s of imports in this forkserver, or in
        # every rank on a GPU node) and no rank uses a name of it. Marked as run, it is run nowhere:
        # multiprocessing.spawn skips a main whose __file__ is already the one it is handed
        sys.modules["__main__"].__file__ = path
        return
    if not data or _gpu_node():
        return
    from multiprocessing import process, spawn

    # read by multiprocessing.spawn (a private name: tests/unit/test_upstream_contracts.py checks it still is)
    process.current_process()._inheriting = True  # type: ignore[attr-defined]   # as in a child: a main that starts processes is refused
    try:
        spawn.prepare(data)
    except (Exception, SystemExit) as e:        # the ranks then run it themselves, as they did: its error is theirs
        print(f"parsl-bft rank forkserver: could not preload the main module ({e!r}); each rank runs it",
              file=sys.stderr)
    finally:
        del process.current_process()._inheriting  # type: ignore[attr-defined]


if MAIN_ENV in os.environ:   # in the launcher's forkserver (it alone starts with it; _prepare_main takes it)
    # the scheduler's TERM to a pilot's group is its ranks' notice to save, and the forkserver they die with must
    # not die of it (it goes with its worker). Blocked, not ignored: a child gets a TERM sent before it unblocks
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
forget_safe_path_env()      # the forkserver started with a safe path (launcher); the user's subprocesses do not
_prepare_main()
torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())
