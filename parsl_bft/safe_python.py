"""Python helper processes that never import from the folder they start in.

``python -m MOD`` and ``python -c CODE`` put the current folder first on ``sys.path``: started from a folder
another user can write (a group project folder, /tmp), a ``parsl_bft/`` (or ``torch/``) package planted there
would run as the user. Every Python process parsl-bft starts is built here: ``-P`` (Python 3.11's safe path)
drops that entry and still reads the environment (``PYTHONPATH``, a virtual environment), which ``-I`` would
not. Processes that multiprocessing starts itself (the forkserver, its resource tracker) take no flags from
us: ``safe_path_env()`` gives them ``PYTHONSAFEPATH``, the same switch as an environment variable. No Parsl, no
torch: the rendezvous store and the interchange's watcher import this."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SAFE_PATH_ENV = "PYTHONSAFEPATH"
# set next to SAFE_PATH_ENV by safe_path_env(): the variable is ours, and a process that starts the user's code
# (the rank forkserver) removes both, so the user's own ``python script.py`` keeps its script folder on sys.path
OURS_ENV = "PARSL_BFT_SAFE_PATH_SET"


def python_command(*args: str) -> list[str]:
    """This Python, with a safe ``sys.path``, running ``args`` (``"-m", MOD, ...`` or ``"-c", CODE, ...``)."""
    return [sys.executable, "-P", *args]


@contextmanager
def safe_path_env() -> Iterator[None]:
    """While inside, Python processes started with this process's environment start with a safe ``sys.path``
    (``PYTHONSAFEPATH``): for launches whose command line is not ours (multiprocessing's). Restored after; a
    ``PYTHONSAFEPATH`` the user set is left as it is."""
    if os.environ.get(SAFE_PATH_ENV):
        yield
        return
    os.environ[SAFE_PATH_ENV] = "1"
    os.environ[OURS_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(SAFE_PATH_ENV, None)
        os.environ.pop(OURS_ENV, None)


def forget_safe_path_env() -> None:
    """In a process started under ``safe_path_env()`` that goes on to run the user's code: remove the variable
    we set, so the user's own Python subprocesses get the usual ``sys.path``."""
    if os.environ.pop(OURS_ENV, None):
        os.environ.pop(SAFE_PATH_ENV, None)
