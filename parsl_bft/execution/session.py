"""One call from a site file to a running trainer: the site's Parsl config, its idle pool, an orchestrator.

    with training_session("bft-state/mine") as trainer:      # the run's site(s), else the embedded default
        fut = trainer.submit(TrainingJob("cnn", ...))
        trainer.run()

``parsl-bft run WORKFLOW.py --site A.yaml [--site B.yaml]`` hands its sites to the session in-process
(``execution.run``); a workflow started as plain ``python WORKFLOW.py`` takes them from $PARSL_BFT_SITE. What each
site file means to the runtime is decided in one place, ``execution.site_runtime``.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import BadValue
from ..sites import DEFAULT_SITE, Site, load_site
from .htex import release_dead_interchanges
from .pilot import PilotProvider
from .run import RunSettings, current_settings
from .signals import sigterm_unwinds, stop_reason
from .site_runtime import SiteRuntime, check_sites, checkpoint_dir, make_planner, make_pool, site_topology

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.dataflow.dflow import DataFlowKernel
    from parsl.executors.base import ParslExecutor

    from .orchestrator import Orchestrator

__all__ = ["DEFAULT_SITE", "LOGIN", "checkpoint_dir", "current_site", "make_planner", "make_pool", "set_aside",
           "site_topology", "training_session"]

SiteArg = Site | str | Path | None


def current_site(site: SiteArg = None) -> Site:
    """A site: as given (a Site, or a site file's path), else the embedded default."""
    if isinstance(site, Site):
        return site
    return load_site(site or DEFAULT_SITE)


def _sites(site: SiteArg | Sequence[SiteArg], settings: RunSettings) -> list[Site]:
    """The session's sites: as given, else the run's (``settings``), else the embedded default."""
    if site is None:
        return [current_site(s) for s in settings.sites] or [current_site()]
    if isinstance(site, (Site, str, Path)):
        return [current_site(site)]
    return [current_site(s) for s in site]


def set_aside(state_dir: Path) -> Path | None:
    """A fresh run in ``state_dir``: the old state (jobs, checkpoints, event log) is renamed, not deleted, to
    ``<state_dir>.old-<time>``; refused while an orchestrator holds it."""
    from .orchestrator import lock_state_dir
    from .statedir import DATABASE

    if not (state_dir / DATABASE).exists():
        return None
    lock_state_dir(state_dir).close()
    old = state_dir.with_name(f"{state_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    state_dir.rename(old)
    return old


@contextmanager
def training_session(state_dir: str | Path, site: SiteArg | Sequence[SiteArg] = None, *,
                     new_run: bool | None = None, progress: Any = None,
                     **orchestrator_kw: Any) -> Iterator[Orchestrator]:
    """Load the Parsl config of one site - or of several (a list, or the run's sites): then one executor per
    site, a MultiPool and the multi-site planner - and yield an Orchestrator whose loop already runs in the
    background: submitted jobs' futures resolve on their own (Parsl apps can take them as inputs); ``run()``
    waits for the jobs. Leaving the session (or Ctrl-C, SIGTERM) checkpoints what still trains and gives every
    node back. With a Parsl config loaded already, the session's executors join that DataFlowKernel (and end with
    it); else the session loads its own, with a ``login`` executor for the user's apps that must not run on
    pilots.

    ``new_run`` (default: the run's, `parsl-bft run --new-run`): set the old state aside and start afresh (jobs
    whose spec changed keep their names). ``progress``: a callback per loop turn (default: live bars on stderr
    when the run asks for them, as `parsl-bft run` does)."""
    from .config import ensure_venv_on_path
    from .statedir import check_plain_path

    check_plain_path(Path(state_dir))      # before anything is made or started there
    settings = current_settings()
    sites = _sites(site, settings)
    check_sites(sites)     # before building a Config: a Globus Compute site's would log in for nothing
    runtimes = [SiteRuntime.of(s) for s in sites]
    # refused before any pilot is started
    orchestrator_kw["state_lock"] = lock = _take_state_dir(Path(state_dir), runtimes,
                                                           new_run if new_run is not None else settings.new_run)
    try:
        ensure_venv_on_path()          # pilots inherit PATH: their worker pools start from this environment
        configs = [rt.config() for rt in runtimes]
        check_schedulers(runtimes, configs)
    except BaseException:
        lock.close()
        raise
    first = configs[0]
    with _dataflow([c.executors[0] for c in configs], retries=first.retries, strategy=first.strategy,
                   strategy_period=first.strategy_period, initialize_logging=first.initialize_logging,
                   run_dir=str(Path(state_dir).resolve() / "runinfo")) as dfk:  # pilot scripts, notice marks
        orch = _orchestrator(state_dir, runtimes, dfk, orchestrator_kw)
        if progress is None and settings.progress:
            from .live import LiveBars
            progress = LiveBars()
        with sigterm_unwinds():        # SIGTERM unwinds the session like Ctrl-C
            why = None
            try:
                with progress if isinstance(progress, AbstractContextManager) else nullcontext():
                    yield orch.start(progress=progress)  # futures resolve on their own; run() waits for the jobs
            except (Exception, KeyboardInterrupt) as e:
                why = stop_reason(e)    # the event log says interrupted (Ctrl-C), SIGTERM or the error
                raise
            finally:
                try:
                    release_dead_interchanges(dfk)   # a command to one would block the stop for ever
                    orch.stop(why)  # running fragments checkpoint, pilots are given back
                finally:
                    orch.close()    # the state directory's lock goes with the session
                    release_dead_interchanges(dfk)   # and Parsl's cleanup (its status poller), next


def _take_state_dir(state_dir: Path, runtimes: list[SiteRuntime], new_run: bool) -> IO[str]:
    """The state directory set aside (``new_run``), made, locked, and the sites' checkpoint_dirs checked: its
    lock. One that cannot be made, written or locked (read-only, full, a path too long) is a StateError."""
    from .statedir import lock_state_dir, unusable

    try:
        if new_run:
            old = set_aside(state_dir)
            if old is not None:
                print(f"parsl-bft: a new run; the previous state is kept in {old}", file=sys.stderr)
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = lock_state_dir(state_dir)
    except OSError as e:
        raise unusable(state_dir, e) from None
    try:
        check_checkpoint_dirs(state_dir, runtimes)
    except BaseException:
        lock.close()
        raise
    return lock


def _orchestrator(state_dir: str | Path, runtimes: list[SiteRuntime], dfk: DataFlowKernel,
                  kw: dict[str, Any]) -> Orchestrator:
    """One site: its pool, its planner (with the network groups its pool learned) and its executor; several: a
    MultiPool of their pools and the multi-site planner (``check_sites`` made their objectives one)."""
    from .orchestrator import Orchestrator
    from .pool import MultiPool, PilotPool

    pools = [rt.pool(dfk.executors[rt.label]) for rt in runtimes]
    kw.setdefault("weights", runtimes[0].site.objective.weights)
    if len(runtimes) == 1:
        rt, pool = runtimes[0], pools[0]
        learned = pool.topology if isinstance(pool, PilotPool) else None
        return Orchestrator(state_dir, pool, rt.planner(learned), executor=rt.label,
                            checkpoint_dir=rt.checkpoint_dir, ranks_per_node=rt.ranks_per_node, **kw)
    from ..planner.multisite import MultiSitePlanner

    multi = MultiPool({rt.site.name: rt.site_pool(p) for rt, p in zip(runtimes, pools)})
    return Orchestrator(state_dir, multi, MultiSitePlanner(runtimes[0].planner()), **kw)


def check_schedulers(runtimes: list[SiteRuntime], configs: list[Config]) -> None:
    """Each pilot site's scheduler asked, before any executor or pilot starts, whether it would take the site's
    pilots (``SiteRuntime.check_scheduler``): a partition or queue it lacks or a job it refuses stops the run now,
    not after minutes of "waiting"."""
    for rt, c in zip(runtimes, configs):
        provider = getattr(c.executors[0], "provider", None)
        if isinstance(provider, PilotProvider):
            rt.check_scheduler(provider)


def check_checkpoint_dirs(state_dir: Path, runtimes: list[SiteRuntime]) -> None:
    """Each site's checkpoint_dir, and this run's folder in it, made and checked (the user's own, writable by
    nobody else) before any pilot starts: a refusal comes first, not with the first fragment."""
    from .statedir import StateDir

    state = StateDir(state_dir)
    for rt in runtimes:
        if rt.checkpoint_dir is not None:
            state.jobs_root(rt.site.name, rt.checkpoint_dir)


LOGIN = "login"


@contextmanager
def _dataflow(executors: list[ParslExecutor], **config_kw: Any) -> Iterator[DataFlowKernel]:
    """The user's DataFlowKernel when one is loaded already (the session's ``executors`` join it and end with
    it), else one loaded for the session, with a ``login`` executor (threads in this process) for the user's own
    apps that must not run on preemptable pilots: ``@python_app(executors=["login"])``."""
    import parsl
    from parsl.config import Config
    from parsl.errors import NoDataFlowKernelError
    from parsl.executors import ThreadPoolExecutor

    try:
        dfk: DataFlowKernel | None = parsl.dfk()
    except NoDataFlowKernelError:
        dfk = None    # loaded below, outside this handler: an error in the session's block would else show as
                      # raised "during handling of" NoDataFlowKernelError
    if dfk is None:
        with _children_ignore_sigint():
            own = parsl.load(Config(executors=[*executors, ThreadPoolExecutor(label=LOGIN, max_threads=4)],
                                    **config_kw))
        with own:
            yield own
        return
    clash = sorted(e.label for e in executors if e.label in dfk.executors)
    if clash:
        raise BadValue(f"the Parsl config already loaded has executor(s) {clash}, the label(s) of this session's "
                       "site(s): rename yours, or give the site another name")
    with _children_ignore_sigint():
        dfk.add_executors(executors)
    yield dfk


@contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """A terminal's Ctrl-C goes to the whole foreground process group: an interchange started now inherits
    SIGINT ignored (it survives, so this process can stop the run cleanly; a dead interchange hangs Parsl's
    cleanup). This process still gets its KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
