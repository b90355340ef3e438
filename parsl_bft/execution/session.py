"""One call from a site file to a running trainer: the site's Parsl config, its idle pool, an orchestrator.

    with training_session("bft-state/mine") as trainer:      # site: $PARSL_BFT_SITE, else the embedded default
        fut = trainer.submit(TrainingJob("cnn", ...))
        trainer.run()

``parsl-bft run WORKFLOW.py --site SITE.yaml`` sets $PARSL_BFT_SITE for the workflow.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from ..sites import Emulation, Site, build_config, load_site

DEFAULT_SITE = Path(__file__).resolve().parent.parent.parent / "site_configs" / "local.yaml"


def current_site(site: Site | str | Path | None = None) -> Site:
    if isinstance(site, Site):
        return site
    return load_site(site or os.environ.get("PARSL_BFT_SITE") or DEFAULT_SITE)


def make_pool(site: Site, executor):
    """The site's live idle capacity: pilots through its executor, or (local) the emulated pool."""
    from .pool import EmulatedPool, PilotPool

    if site.scheduler == "local":
        emu = site.emulation or Emulation()
        kw = dict(speedup=emu.speedup, notice_s=emu.notice_seconds, repeat=True)
        if emu.trace == "demo":
            return EmulatedPool.demo(**kw)
        from ..idle.intervals import read_idle_intervals
        return EmulatedPool(read_idle_intervals(emu.trace), **kw)
    return PilotPool(executor, max_nodes=site.holes.max_pilots, probe_s=site.holes.poll_seconds,
                     notice_s=site.holes.notice_seconds)


def make_planner(site: Site):
    from ..planner import Planner

    return Planner(method="dp", objective=site.objective.name, t_fwd=site.objective.t_fwd_seconds)


@contextmanager
def training_session(state_dir: str | Path, site: Site | str | Path | None = None, **orchestrator_kw):
    import parsl

    from .config import ensure_venv_on_path
    from .orchestrator import Orchestrator

    site = current_site(site)
    ensure_venv_on_path()          # pilots inherit PATH: their worker pools start from this environment
    config = build_config(site)
    config.run_dir = str(Path(state_dir).resolve() / "runinfo")     # pilot scripts and notice marks live there
    with parsl.load(config) as dfk:
        label = config.executors[0].label
        pool = make_pool(site, dfk.executors[label])
        yield Orchestrator(state_dir, pool, make_planner(site), executor=label, **orchestrator_kw)
