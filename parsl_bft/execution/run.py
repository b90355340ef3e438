"""``run_workflow()``: run a scientist's workflow file the way ``parsl-bft run`` does, with the run's settings
handed to its ``training_session()`` in-process.

Shared by the command (``parsl-bft run W.py --site A.yaml``) and the remote runner (a run submitted through Globus
Compute runs there as it would here). The settings - the sites, ``--new-run``, live progress bars - are a
``RunSettings`` that ``run_workflow`` makes current while the workflow runs; ``training_session()`` reads
``current_settings()``. Only a workflow started as plain ``python w.py`` takes them from the environment instead:
``$PARSL_BFT_SITE`` (site files separated by ``:``), ``$PARSL_BFT_NEW_RUN=1``, ``$PARSL_BFT_PROGRESS=1``.
"""
from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..sites import Site, load_site

SITE_ENV = "PARSL_BFT_SITE"
NEW_RUN_ENV = "PARSL_BFT_NEW_RUN"
PROGRESS_ENV = "PARSL_BFT_PROGRESS"


@dataclass(frozen=True)
class RunSettings:
    """What a run tells its workflow's ``training_session()``: the sites (none: the embedded default; a site
    file's path is read when the session starts), whether to set the old state aside and start afresh, and
    whether to draw live progress bars (on stderr)."""

    sites: tuple[Site | Path, ...] = ()
    new_run: bool = False
    progress: bool = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> RunSettings:
        """The settings of a workflow started as plain ``python w.py``."""
        paths = environ.get(SITE_ENV, "")
        return cls(tuple(Path(p) for p in paths.split(os.pathsep)) if paths else (),
                   environ.get(NEW_RUN_ENV) == "1", environ.get(PROGRESS_ENV) == "1")


_current: RunSettings | None = None     # set by run_workflow while its workflow runs


def current_settings() -> RunSettings:
    """The settings of the run this process is in: those ``run_workflow`` set, else the environment's."""
    return _current if _current is not None else RunSettings.from_environment()


@contextmanager
def run_settings(settings: RunSettings) -> Iterator[RunSettings]:
    """Make ``settings`` current within the block (then the ones before are current again)."""
    global _current
    before, _current = _current, settings
    try:
        yield settings
    finally:
        _current = before


def run_workflow(path: str | Path, sites: Sequence[Site | str | Path] = (), *, args: Sequence[str] = (),
                 new_run: bool = False, progress: bool = False) -> None:
    """Run the workflow file ``path`` as ``__main__`` with ``args`` as its ``sys.argv[1:]`` and its folder on
    ``sys.path``; its ``training_session()`` runs on ``sites`` (site files are read now, before the workflow
    starts; none: the embedded default), starts afresh with ``new_run`` and draws live bars with ``progress``.

    Raises ``UsageError`` for a missing workflow file, ``SiteError`` for a bad site file, and whatever the
    workflow raises (a ``KeyboardInterrupt`` after Ctrl-C or SIGTERM, once the session has cleaned up)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such workflow file: {p}")
    settings = RunSettings(tuple(s if isinstance(s, Site) else load_site(s) for s in sites), new_run, progress)
    argv = sys.argv
    sys.argv = [str(p), *args]
    sys.path.insert(0, str(p.resolve().parent))
    try:
        with run_settings(settings):
            runpy.run_path(str(p), run_name="__main__")
    finally:
        sys.argv = argv
