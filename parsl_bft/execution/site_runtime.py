"""A validated site -> what the runtime needs: the one place that interprets a site file.

For every site of a run, once (``SiteRuntime.of``): the Parsl Config (its executor and, for Slurm or PBS, the
pilot provider), the idle pool (an ``EmulatedPool`` replaying an idle trace, or a ``PilotPool`` holding holes
with pilots), the planner (objective, look-ahead and, where the network's groups are known, SJF-BCO placement
and sizes valued by their network slowdown), where checkpoints go and how many ranks a fragment runs per node.

Each field reaches the runtime by one road: ``holes.poll_seconds`` becomes the pilot provider's survey period
(whole seconds, at least 1) and the pool probes the scheduler at that same period; ``holes.notice_seconds``
becomes the provider's reclaim notice, which the pool reads from it.

Several sites run under one planner (``planner.multisite``), which has one objective and places without
network groups: ``check_sites`` refuses, naming the site and the field, objectives that differ and a site
file's ``topology:`` section there, rather than using the first site's and ignoring the others'.
"""
from __future__ import annotations

import re
import subprocess
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..extras import optional_imports
from ..sites import Emulation, Site, SiteError
from ..topology import Topology, topology_from_dict
from .commands import SchedulerError
from .config import config_source, constructed, interchange_dies_with_us, local_config
from .pilot import PilotProvider

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.executors.base import ParslExecutor

    from ..planner import Planner
    from .pilot import PilotProvider
    from .pool import EmulatedPool, PilotPool, SitePool
    from .protocols import IdlePool, PilotExecutor

EndpointFactory = Callable[[str], Any]
"""Makes the Globus Compute SDK Executor for an endpoint id."""


def executor_label(site: Site) -> str:
    """The label of a site's Parsl executor: ``bft_<name>``, characters a label may not hold as ``_``."""
    return f"bft_{re.sub(r'[^A-Za-z0-9_]', '_', site.name)}"


def _sdk_executor(endpoint_id: str) -> Any:
    """The real Globus Compute SDK Executor (it logs in: credentials from the environment)."""
    with optional_imports():
        from globus_compute_sdk import Executor

    return Executor(endpoint_id=endpoint_id)


def _unconnected(endpoint_id: str) -> Any:
    """Stands in for the SDK Executor where only the Config's code is wanted (``sites show``): constructing the
    real one logs in to the cloud service."""
    with optional_imports():
        from globus_compute_sdk import Executor

    class Unconnected(Executor):
        resource_specification = None  # type: ignore[override]  # what GlobusComputeExecutor reads from it
        user_endpoint_config = None  # type: ignore[override]
        __repr__ = object.__repr__           # config_source writes Executor(endpoint_id=...) in its place

        def __init__(self) -> None:          # deliberately not Executor.__init__: no login, no thread
            pass

    return constructed(Unconnected(), Executor, endpoint_id=endpoint_id)


def refuse_remote(site: Site) -> None:
    """A Globus Compute site's idle nodes and files are out of this process's sight: its run must be submitted."""
    if site.globus_compute_endpoint:
        raise SiteError(f"site '{site.name}' is reached through Globus Compute: this process cannot see that "
                        "machine's idle nodes or files, so the run's orchestrator must run there. Submit it: "
                        "parsl-bft submit WORKFLOW.py --site SITE.yaml (docs/tutorials/from-a-laptop.md)")


def check_sites(sites: Sequence[Site]) -> None:
    """What must hold before anything is built for a run over ``sites``: distinct names, no Globus Compute site
    (``refuse_remote``), and for several sites what the multi-site planner can honour: one objective, and no
    site file's ``topology:`` (it places every site's jobs without network groups)."""
    if not sites:
        raise SiteError("a run needs a site")
    names = [s.name for s in sites]
    if len(set(names)) < len(names):
        raise SiteError(f"site names must differ within a run: {names}")
    for s in sites:
        refuse_remote(s)          # before building its Config: that would log in to Globus Compute for nothing
    if len(sites) == 1:
        return
    first = sites[0]
    for s in sites[1:]:
        for field in type(s.objective).model_fields:
            mine, theirs = getattr(s.objective, field), getattr(first.objective, field)
            if mine != theirs:
                raise SiteError(f"site '{s.name}': objective.{field} {mine!r} differs from site '{first.name}' "
                                f"({theirs!r}); a run over several sites has one objective: give every site "
                                "the same")
    for s in sites:
        if s.topology is not None:
            raise SiteError(f"site '{s.name}': topology: a run over several sites places jobs without network "
                            "groups (the multi-site planner), so this section would be ignored; run the site on "
                            "its own, or delete the section")


@dataclass(frozen=True)
class SiteRuntime:
    """One site of a run, interpreted once: every value the runtime takes from its site file, and the builders
    of its Parsl objects, pool and planner."""

    site: Site
    label: str                       # its Parsl executor's
    topology: Topology | None        # the site file's network groups (None: the pool may ask the scheduler)
    checkpoint_dir: Path | None      # None: under the run's state directory
    ranks_per_node: int

    @classmethod
    def of(cls, site: Site) -> SiteRuntime:
        """Interpret ``site``; a relative checkpoint_dir is taken from the directory parsl-bft runs in (now)."""
        topology = (None if site.topology is None
                    else topology_from_dict(site.topology, source=f"site {site.name}: topology"))
        ckpt = Path(site.checkpoint_dir).resolve() if site.checkpoint_dir else None
        return cls(site, executor_label(site), topology, ckpt, (site.node.ranks_per_node or 1) if site.node else 1)

    # --- Parsl ------------------------------------------------------------------------------------------------
    def config(self, *, endpoint: EndpointFactory = _sdk_executor) -> Config:
        """The Parsl Config this site runs (``endpoint`` makes the Globus Compute SDK Executor from the
        endpoint id)."""
        from parsl.config import Config

        site = self.site
        if site.globus_compute_endpoint:
            from parsl.executors import GlobusComputeExecutor

            gce = GlobusComputeExecutor(executor=endpoint(str(site.globus_compute_endpoint)), label=self.label)
            return Config(executors=[gce], retries=0)
        if site.scheduler == "local":
            assert site.node is not None           # the schema: every site but a Globus Compute one has a node
            return local_config(workers=site.node.cores, label=self.label)
        return Config(executors=[self.pilot_executor(self.label, self.pilot_provider())], retries=0,
                      strategy="none")

    def pilot_provider(self) -> PilotProvider:
        """The Slurm or PBS pilot provider of the site's holes."""
        site, w, h = self.site, self.site.pilot_walltime, self.site.holes
        assert site.node is not None               # the schema: every site but a Globus Compute one has a node
        common: dict[str, Any] = dict(
            walltime_min_min=w.min_minutes, walltime_max_min=w.max_minutes, notice_s=h.notice_seconds,
            max_pending_s=h.max_pending_seconds, worker_init=site.worker_init, poll_s=max(1, round(h.poll_seconds)),
            scheduler_options=list(site.scheduler_options), max_jobs=h.max_jobs)
        cls: type[PilotProvider]
        if site.scheduler == "slurm":
            from .slurm import SlurmPilotProvider

            cls, kw = SlurmPilotProvider, dict(partition=site.partition, qos=site.preemptable_qos,
                                               account=site.account, gpus_per_node=site.node.gpus, **common)
            kw.update({k: getattr(site, k) for k in ("constraint", "mem", "reservation") if getattr(site, k)})
            kw.update({"grace_s": h.grace_seconds} if h.grace_seconds else {})
        else:
            from .pbs import PBSPilotProvider

            select = f"1:ncpus={site.node.cores}" + (f":ngpus={site.node.gpus}" if site.node.gpus else "")
            select += f":mem={site.mem.lower()}b" if site.mem else ""          # 64G -> PBS's 64gb
            cls, kw = PBSPilotProvider, dict(queue=site.queue, account=site.account,
                                             select=select, **common)
        # recorded so `sites show` can print it while the pilot providers have no code repr of their own
        provider: PilotProvider = constructed(cls(**kw), **kw)
        return provider

    def check_scheduler(self, provider: PilotProvider | None = None) -> str:
        """Ask the site's scheduler whether it would take the site's pilots (``PilotProvider.preflight``: a
        partition or queue it lacks, a test submission it refuses), before any pilot or executor starts: a
        ``SiteError`` naming the site, the field and the scheduler's words, else one line of what it said. The
        embedded default has nothing to ask."""
        if self.site.scheduler == "local":
            return "nothing to ask: the embedded default runs on this machine"
        refuse_remote(self.site)
        try:
            return (provider or self.pilot_provider()).preflight()
        except SiteError as e:
            raise SiteError(f"site '{self.site.name}': {e}") from None
        except (SchedulerError, OSError, subprocess.SubprocessError) as e:
            raise SiteError(f"site '{self.site.name}': its scheduler cannot be asked from here: {e}") from None

    def pilot_executor(self, label: str, provider: PilotProvider) -> HighThroughputExecutor:
        """An (unstarted) executor of the site's pilots: the site's own, or a lane of one network group that
        shares the site's provider (``lanes``)."""
        from parsl.executors import HighThroughputExecutor
        from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

        from ..train.rank_server import LAUNCH
        from .block_errors import pilot_block_error_handler

        address: dict[str, Any] = {"address": self.site.interchange_address} if self.site.interchange_address else {}
        return HighThroughputExecutor(
            label=label,
            max_workers_per_node=1,                   # one fragment slot per pilot node: its ranks use the node
            heartbeat_period=5, heartbeat_threshold=20,   # pilots come and go: notice lost ones soon
            block_error_handler=pilot_block_error_handler,  # a pilot that ends is normal
            interchange_launch_cmd=interchange_dies_with_us(),
            launch_cmd=f"{LAUNCH} {DEFAULT_LAUNCH_CMD}",  # torch imported as the pool starts, not after (rank_server)
            provider=provider,
            **address,
        )

    # --- the pool and the planner -------------------------------------------------------------------------
    def pool(self, executor: ParslExecutor | None) -> EmulatedPool | PilotPool:
        """The site's live idle capacity: pilots through its (started) ``executor``, or (local) the emulated
        pool. Pilots know the network's groups from the site file's ``topology:`` section, else from the
        scheduler (asked once); with them, each group's pilots get an executor of their own (``lanes``)."""
        from .lanes import dfk_lane_factory
        from .pool import EmulatedPool, PilotPool

        refuse_remote(self.site)
        if self.site.scheduler == "local":
            emu = self.site.emulation or Emulation()
            if emu.trace == "demo":
                return EmulatedPool.demo(speedup=emu.speedup, notice_s=emu.notice_seconds, repeat=True)
            from ..idle.intervals import read_idle_intervals

            return EmulatedPool(read_idle_intervals(emu.trace), speedup=emu.speedup, notice_s=emu.notice_seconds,
                                repeat=True)
        assert executor is not None, "a pilot pool needs the site's started executor"
        pilots = cast("PilotExecutor", executor)        # the HighThroughputExecutor config() made
        provider: PilotProvider = pilots.provider       # it holds the survey period and the notice: one road each
        return PilotPool(pilots, max_nodes=self.site.holes.max_pilots, probe_s=provider.status_polling_interval,
                         max_per_minute=self.site.holes.max_pilots_per_minute,
                         unused_s=self.site.holes.unused_pilot_seconds, topology=self.topology,
                         new_executor=cast("Callable[[str], PilotExecutor]",   # an HTEX's provider is read-only
                                           dfk_lane_factory(lambda label: self.pilot_executor(label, provider))))

    def planner(self, topology: Topology | None = None) -> Planner:
        """The site's planner. Where its network's groups are known (``topology``: what its pool learned; else
        the site file's) it gets SJF-BCO's placement and sizes valued by their predicted network slowdown. A
        node the topology does not know (added to the machine after the site file was written or the scheduler
        was asked) is a group of its own, placed as the contention-blind worst case, never a run stopped by a
        stale site file."""
        from ..planner import Planner

        kw: dict[str, Any] = {}
        topo = topology if topology is not None else self.topology
        if topo is not None:
            from ..planner.netcost import NetworkCost
            from ..planner.topo_placement import BcoPlacement

            topo = replace(topo, singletons=True)
            kw = {"placement": BcoPlacement(topo), "network": NetworkCost(topo)}
        return Planner(method="dp", objective=self.site.objective.name, t_fwd=self.site.objective.t_fwd_seconds,
                       **kw)

    def site_pool(self, pool: IdlePool) -> SitePool:
        """This site as one of several in a ``MultiPool``."""
        from .pool import SitePool

        return SitePool(pool, self.label, self.checkpoint_dir, self.ranks_per_node)


# --- one site file, one call (``sites show``, tests, scripts) -----------------------------------------------

def build_config(site: Site, *, endpoint: EndpointFactory = _sdk_executor) -> Config:
    """The Parsl Config ``site`` runs (``endpoint`` makes the Globus Compute SDK Executor from the endpoint id)."""
    return SiteRuntime.of(site).config(endpoint=endpoint)


def show_config(site: Site) -> str:
    """The site's Config as Python code: its own repr plus imports (what ``parsl-bft sites show`` prints)."""
    comment = ("# credentials: GLOBUS_COMPUTE_CLIENT_ID / GLOBUS_COMPUTE_CLIENT_SECRET in the environment\n"
               if site.globus_compute_endpoint else "")
    with warnings.catch_warnings():
        # HTEX without an address probes this host's addresses and leaves a socket for the collector: Parsl's,
        # and nothing the reader of the code can act on
        warnings.simplefilter("ignore", ResourceWarning)
        config = build_config(site, endpoint=_unconnected)
    return config_source(config, comment)


PLACEHOLDER_RUN_DIR = "<state_dir>/runinfo/<run>/submit_scripts"


def show_pilot_script(site: Site) -> str:
    """The batch script of the site's next pilot, as it would be submitted (nothing is submitted): a dry run of
    what ``parsl-bft run`` asks of the scheduler. The worker command's {placeholders} are what Parsl fills in when
    the executor starts (its addresses and ports)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        config = build_config(site, endpoint=_unconnected)
    scripts = []
    for ex in config.executors:
        provider = getattr(ex, "provider", None)
        if not isinstance(provider, PilotProvider):
            continue
        provider.script_dir = PLACEHOLDER_RUN_DIR     # Parsl sets it when the run starts
        # Parsl formats it when the executor starts (and {{block_id}} per block)
        command = str(getattr(ex, "launch_cmd", "")).replace("{{", "{").replace("}}", "}")
        head = (f"# the next pilot of executor {ex.label} (site {site.name}): {site.pilot_walltime.max_minutes} "
                f"minutes, {provider.default_shape().nodes} node(s); at run time a pilot's walltime is its hole's "
                f"length within pilot_walltime, it may be aimed at the hole's node, its name is its Parsl block's, and "
                f"Parsl fills in the {{...}} when the executor starts")
        scripts.append(head + "\n" + provider.script(command, "parsl.bft", site.pilot_walltime.max_minutes)
                       + _not_in_the_script(site))
    if not scripts:
        raise SiteError(f"site '{site.name}' ({site.scheduler}) submits no pilot jobs: the embedded default runs on "
                        "this machine (nothing to show)")
    return "\n".join(scripts)


def _not_in_the_script(site: Site) -> str:
    """The site's settings that shape the run but not the batch script, as comments under it: what the script
    shows and this list together are the whole site file."""
    h = site.holes
    lines = [f"ranks per node: {SiteRuntime.of(site).ranks_per_node} (a fragment's ranks on each node)",
             f"checkpoint_dir: {site.checkpoint_dir + '/<run-id>' if site.checkpoint_dir else '<state_dir>/jobs'}",
             f"interchange_address: {site.interchange_address or 'every address of this host (probed)'}",
             f"holes: a survey every {h.poll_seconds:g} s, queued pilots withdrawn after {h.max_pending_seconds:g} s, "
             f"at most {h.max_pilots} nodes" + (f" and {h.max_jobs} jobs" if h.max_jobs else ""),
             f"objective: {site.objective.name}, T_fwd {site.objective.t_fwd_seconds:g} s",
             f"topology: {'the site file' if site.topology else 'from the scheduler, where it knows one'}"]
    return "".join(f"# not in the script - {line}\n" for line in lines)


def make_pool(site: Site, executor: ParslExecutor | None) -> EmulatedPool | PilotPool:
    """``site``'s idle pool on its started ``executor`` (``SiteRuntime.pool``)."""
    return SiteRuntime.of(site).pool(executor)


def make_planner(site: Site, topology: Topology | None = None) -> Planner:
    """``site``'s planner, with ``topology`` if its pool learned one (``SiteRuntime.planner``)."""
    return SiteRuntime.of(site).planner(topology)


def site_topology(site: Site) -> Topology | None:
    """The site file's ``topology:`` section as a Topology, or None."""
    return SiteRuntime.of(site).topology


def checkpoint_dir(site: Site) -> Path | None:
    """The site's checkpoint_dir (relative: from the directory parsl-bft runs in), or None: under the state
    directory."""
    return SiteRuntime.of(site).checkpoint_dir
