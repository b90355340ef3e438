"""One call from a site file to a running trainer: the site's Parsl config, its idle pool, an orchestrator.

    with training_session("bft-state/mine") as trainer:      # site: $PARSL_BFT_SITE, else the embedded default
        fut = trainer.submit(TrainingJob("cnn", ...))
        trainer.run()

``parsl-bft run WORKFLOW.py --site A.yaml [--site B.yaml]`` sets $PARSL_BFT_SITE for the workflow.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from importlib.resources import files
from pathlib import Path

from ..sites import Emulation, Site, SiteError, build_config, load_site

DEFAULT_SITE = Path(str(files("parsl_bft") / "data" / "sites" / "local.yaml"))   # ships inside the package


def current_site(site: Site | str | Path | None = None) -> Site:
    if isinstance(site, Site):
        return site
    return load_site(site or os.environ.get("PARSL_BFT_SITE") or DEFAULT_SITE)


def _refuse_remote(site: Site) -> None:
    if site.globus_compute_endpoint:
        raise SiteError(f"site '{site.name}' is reached through Globus Compute: this process cannot see that "
                        "machine's idle nodes or files, so the run's orchestrator must run there. Submit it: "
                        "parsl-bft submit WORKFLOW.py --site SITE.yaml (docs/globus-compute.md)")


def make_pool(site: Site, executor):
    """The site's live idle capacity: pilots through its executor, or (local) the emulated pool. Pilots know
    the network's groups from the site file's ``topology:`` section, else from the scheduler (asked once); with
    them, each group's pilots get an executor of their own, built like ``executor`` (parsl_bft.execution.lanes)."""
    from .lanes import dfk_lane_factory
    from .pool import EmulatedPool, PilotPool

    _refuse_remote(site)
    if site.scheduler == "local":
        emu = site.emulation or Emulation()
        kw = dict(speedup=emu.speedup, notice_s=emu.notice_seconds, repeat=True)
        if emu.trace == "demo":
            return EmulatedPool.demo(**kw)
        from ..idle.intervals import read_idle_intervals
        return EmulatedPool(read_idle_intervals(emu.trace), **kw)
    return PilotPool(executor, max_nodes=site.holes.max_pilots, probe_s=site.holes.poll_seconds,
                     notice_s=site.holes.notice_seconds, topology=site_topology(site),
                     new_executor=dfk_lane_factory(lambda: build_config(site).executors[0], executor.provider))


def site_topology(site: Site):
    """The site file's ``topology:`` section as a Topology, or None."""
    if site.topology is None:
        return None
    from ..topology import topology_from_dict
    return topology_from_dict(site.topology, source=f"site {site.name}: topology")


def checkpoint_dir(site: Site) -> Path | None:
    """The site's checkpoint_dir (relative: from the directory parsl-bft runs in), or None: under the state
    directory."""
    return Path(site.checkpoint_dir).resolve() if site.checkpoint_dir else None


def site_runtime(site: Site) -> dict:
    """What the orchestrator needs from a site file beyond its pool and planner: the keyword arguments of
    ``Orchestrator`` for one site, the fields of ``SitePool`` for several."""
    return {"checkpoint_dir": checkpoint_dir(site), "ranks_per_node": site.node.ranks_per_node}


def make_planner(site: Site, topology=None):
    """A site whose network's groups are known (``topology``: what its pool learned; else its ``topology:``
    section) gets SJF-BCO's placement and sizes valued by their predicted network slowdown. Pilots per group
    make a fragment's ranks run in the groups planned (parsl_bft.execution.lanes). A node the topology does not
    know (added to the machine after the site file was written or the scheduler was asked) is a group of its
    own, placed as the contention-blind worst case, never a run stopped by a stale site file."""
    from dataclasses import replace

    from ..planner import Planner

    kw = {}
    topo = topology if topology is not None else site_topology(site)
    if topo is not None:
        topo = replace(topo, singletons=True)
        from ..planner.netcost import NetworkCost
        from ..planner.topo_placement import BcoPlacement
        kw = {"placement": BcoPlacement(topo), "network": NetworkCost(topo)}
    return Planner(method="dp", objective=site.objective.name, t_fwd=site.objective.t_fwd_seconds, **kw)


def set_aside(state_dir: Path) -> Path | None:
    """A fresh run in ``state_dir``: the old state (jobs, checkpoints, event log) is renamed, not deleted, to
    ``<state_dir>.old-<time>``; refused while an orchestrator holds it."""
    from .orchestrator import lock_state_dir

    if not (state_dir / "state.sqlite").exists():
        return None
    lock_state_dir(state_dir).close()
    old = state_dir.with_name(f"{state_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    state_dir.rename(old)
    return old


@contextmanager
def training_session(state_dir: str | Path, site=None, *, new_run: bool | None = None, progress=None,
                     **orchestrator_kw):
    """Load the Parsl config of one site - or of several (a list, or $PARSL_BFT_SITE with paths separated by
    ':'): then one executor per site, a MultiPool and the multi-site planner - and yield an Orchestrator whose
    loop already runs in the background: submitted jobs' futures resolve on their own (Parsl apps can take them
    as inputs); ``run()`` waits for the jobs. Leaving the session (or Ctrl-C, SIGTERM) checkpoints what still
    trains and gives every node back. With a Parsl config loaded already, the session's executors join that
    DataFlowKernel (and end with it); else the session loads its own, with a ``login`` executor for the user's
    apps that must not run on pilots.

    ``new_run`` (default: $PARSL_BFT_NEW_RUN, set by `parsl-bft run --new-run`): set the old state aside and start
    afresh (jobs whose spec changed keep their names). ``progress``: a callback per loop turn (default: live
    bars on stderr when $PARSL_BFT_PROGRESS is 1, as under `parsl-bft run`)."""
    from .config import ensure_venv_on_path
    from .orchestrator import Orchestrator, lock_state_dir
    from .pool import MultiPool, SitePool

    if site is None and os.environ.get("PARSL_BFT_SITE"):
        site = os.environ["PARSL_BFT_SITE"].split(os.pathsep)
    sites = [current_site(s) for s in (site if isinstance(site, (list, tuple)) else [site])]
    if len({s.name for s in sites}) < len(sites):
        raise ValueError(f"site names must differ within a run: {[s.name for s in sites]}")
    for s in sites:
        _refuse_remote(s)          # before building its Config: that would log in to Globus Compute for nothing
    if new_run if new_run is not None else os.environ.get("PARSL_BFT_NEW_RUN") == "1":
        old = set_aside(Path(state_dir))
        if old is not None:
            print(f"parsl-bft: a new run; the previous state is kept in {old}", file=sys.stderr)
    Path(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    orchestrator_kw["state_lock"] = lock_state_dir(Path(state_dir))   # refused before any pilot is started
    ensure_venv_on_path()          # pilots inherit PATH: their worker pools start from this environment
    configs = [build_config(s) for s in sites]
    first = configs[0]
    with _dataflow([c.executors[0] for c in configs], retries=first.retries, strategy=first.strategy,
                   initialize_logging=first.initialize_logging,
                   run_dir=str(Path(state_dir).resolve() / "runinfo")) as dfk:  # pilot scripts, notice marks
        labels = [c.executors[0].label for c in configs]
        pools = [make_pool(s, dfk.executors[label]) for s, label in zip(sites, labels)]
        orchestrator_kw.setdefault("weights", sites[0].objective.weights)
        if len(sites) == 1:
            orch = Orchestrator(state_dir, pools[0], make_planner(sites[0], getattr(pools[0], "topology", None)),
                                executor=labels[0], **site_runtime(sites[0]), **orchestrator_kw)
        else:
            from ..planner.multisite import MultiSitePlanner
            multi = MultiPool({s.name: SitePool(p, label, **site_runtime(s))
                               for s, p, label in zip(sites, pools, labels)})
            orch = Orchestrator(state_dir, multi, MultiSitePlanner(make_planner(sites[0])), **orchestrator_kw)
        old = None
        if threading.current_thread() is threading.main_thread():   # SIGTERM unwinds the session like Ctrl-C
            old = signal.signal(signal.SIGTERM, _interrupt)
        if progress is None and os.environ.get("PARSL_BFT_PROGRESS") == "1":
            from .live import LiveBars
            progress = LiveBars()
        try:
            with progress if hasattr(progress, "__enter__") else nullcontext():
                yield orch.start(progress=progress)  # futures resolve on their own; run() waits for the jobs
        finally:
            try:
                orch.stop()     # running fragments checkpoint, pilots are given back
            finally:
                orch.close()    # the state directory's lock goes with the session
                if old is not None:
                    signal.signal(signal.SIGTERM, old)


LOGIN = "login"


@contextmanager
def _dataflow(executors: list, **config_kw):
    """The user's DataFlowKernel when one is loaded already (the session's ``executors`` join it and end with
    it), else one loaded for the session, with a ``login`` executor (threads in this process) for the user's own
    apps that must not run on preemptable pilots: ``@python_app(executors=["login"])``."""
    import parsl
    from parsl.config import Config
    from parsl.errors import NoDataFlowKernelError
    from parsl.executors import ThreadPoolExecutor

    try:
        dfk = parsl.dfk()
    except NoDataFlowKernelError:
        with _children_ignore_sigint():
            dfk = parsl.load(Config(executors=[*executors, ThreadPoolExecutor(label=LOGIN, max_threads=4)],
                                    **config_kw))
        with dfk:
            yield dfk
        return
    clash = sorted(e.label for e in executors if e.label in dfk.executors)
    if clash:
        raise ValueError(f"the Parsl config already loaded has executor(s) {clash}, the label(s) of this session's "
                         "site(s): rename yours, or give the site another name")
    with _children_ignore_sigint():
        dfk.add_executors(executors)
    yield dfk


@contextmanager
def _children_ignore_sigint():
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


def _interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt("SIGTERM")
