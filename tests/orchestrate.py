"""A small orchestrated run, started as a separate process by the tests (so it can be killed and restarted).

usage: python tests/orchestrate.py STATE_DIR [TIMEOUT_S [SITE.yaml | two-sites | steady [IMG_STEPS]]]
Without a site file: the embedded default on a fast emulated pattern; with one: that site's pilots;
"two-sites": two local sites, the first reclaimed for good early on; "steady": img alone on one node that
stays idle (losses only come from outside). Periodic checkpoints every 1-2 s (FAST_SAVES).
"""
import json
import sys

import parsl

from parsl_bft.execution import EmulatedPool, Orchestrator, TrainingJob, local_config
from parsl_bft.execution.checkpoint_policy import CheckpointPolicy
from parsl_bft.execution.config import ensure_venv_on_path
from parsl_bft.planner import Planner
from parsl_bft.train.checkpoint import CheckpointStore
from parsl_bft.train.fragment import FragmentConfig, train_rank
from parsl_bft.train.launcher import run_fragment

IMG = dict(workload="images", global_batch=32, workload_args={"n": 512})
LM = dict(workload="lm", global_batch=16, workload_args={"n_chars": 20_000})
LM_STEPS = 200


EMULATED_IMG_STEPS = 4000
FAST_SAVES = dict(min_interval_s=1.0, max_interval_s=2.0)    # tests: many periodic saves in a short run


def jobs(img_steps: int = 600, img_max_nodes: int = 2) -> list[TrainingJob]:
    return [TrainingJob("img", samples=32 * img_steps, min_nodes=1, max_nodes=img_max_nodes, rate_guess=3000.0,
                        **IMG),
            TrainingJob("lm", samples=16 * LM_STEPS, min_nodes=1, max_nodes=2, rate_guess=300.0, **LM)]


def reference_model(directory, job: str, img_steps: int = 600, world_size: int = 1) -> dict:
    """The same job trained without interruption (on ``world_size`` ranks)."""
    kw = dict(IMG, steps=img_steps) if job == "img" else dict(LM, steps=LM_STEPS)
    cfg = FragmentConfig(job=job, checkpoint_dir=str(directory), fsync=False, world_size=world_size, **kw)
    train_rank(cfg) if world_size == 1 else run_fragment(cfg)
    return CheckpointStore(directory).latest().model


def reference_fragment(cfg: dict) -> None:
    """One fragment of ``cfg`` (FragmentConfig fields) run through, uninterrupted (a loop job's reference)."""
    run_fragment(FragmentConfig(**cfg))


def _run(orch, timeout_s, img_steps=600, img_max_nodes=2):
    futs = {j.name: orch.submit(j) for j in jobs(img_steps, img_max_nodes)}
    summary = orch.run(timeout_s=timeout_s)
    results = {n: f.result() if f.done() and f.exception() is None else None for n, f in futs.items()}
    print(json.dumps({"summary": summary.as_dict(), "results": results}), flush=True)


def two_sites(state_dir: str, timeout_s: float, img_steps: int) -> None:
    """Site "a" (2 nodes) is idle for the first 8 s only; site "b" (2 nodes) from 4 s on. One executor each."""
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    from parsl_bft.execution.pool import MultiPool, SitePool
    from parsl_bft.idle.intervals import IdleIntervals
    from parsl_bft.planner.multisite import MultiSitePlanner

    def pool(start, end):
        return EmulatedPool(IdleIntervals.build(["node0", "node1"], [0, 1], [start] * 2, [end] * 2, 0.0, 600.0),
                            speedup=1.0, notice_s=2.0)
    # one worker each: one job, one fragment at a time (a second worker was one more rank forkserver to warm up)
    htex = [HighThroughputExecutor(label=f"site_{n}", address="127.0.0.1", max_workers_per_node=1,
                                   cpu_affinity="none", provider=LocalProvider(init_blocks=1, max_blocks=1))
            for n in "ab"]
    sites = MultiPool({"a": SitePool(pool(0.0, 8.0), "site_a"), "b": SitePool(pool(4.0, 600.0), "site_b")})
    with parsl.load(Config(executors=htex, run_dir=f"{state_dir}/runinfo", retries=0, strategy="none")):
        planner = MultiSitePlanner(Planner(method="milp", objective="throughput", t_fwd=20.0), move_s=30.0)
        orch = Orchestrator(state_dir, sites, planner)
        fut = orch.submit(jobs(img_steps)[0])
        summary = orch.run(timeout_s=timeout_s)
        print(json.dumps({"summary": summary.as_dict(), "results": {"img": fut.result() if fut.done() else None}}),
              flush=True)


def main(state_dir: str, timeout_s: float = 300.0, site: str | None = None, img_steps: int = 600) -> None:
    if site == "two-sites":
        ensure_venv_on_path()
        return two_sites(state_dir, timeout_s, img_steps)
    if site == "steady":
        pool = EmulatedPool.pattern(nodes=1, period_s=100_000.0, cycles=1, notice_s=2.0)
        with parsl.load(local_config(workers=1, run_dir=f"{state_dir}/runinfo")):    # one job: one fragment at a time
            orch = Orchestrator(state_dir, pool, Planner(method="dp", objective="throughput", t_fwd=20.0),
                                checkpoint_policy=CheckpointPolicy(**FAST_SAVES))
            fut = orch.submit(jobs(img_steps, 1)[0])
            summary = orch.run(timeout_s=timeout_s)
            print(json.dumps({"summary": summary.as_dict(), "results": {"img": fut.result() if fut.done() else None}}),
                  flush=True)
        return
    if site:
        from parsl_bft.execution.session import training_session
        with training_session(state_dir, site, checkpoint_policy=CheckpointPolicy(**FAST_SAVES)) as orch:
            _run(orch, timeout_s, img_steps)
        return
    # two nodes, every 12 s: node0 idle for 4 s, node1 for 8 s; each leaves after a 2 s notice. img runs on one
    # node (so its model must equal uninterrupted training bit for bit), long enough to be reclaimed several times;
    # two workers: two jobs run at most two fragments at once (each worker is a rank forkserver to warm up)
    pool = EmulatedPool.pattern(nodes=2, period_s=12.0, cycles=1000, notice_s=2.0)
    with parsl.load(local_config(workers=2, run_dir=f"{state_dir}/runinfo")):
        _run(Orchestrator(state_dir, pool, Planner(method="dp", objective="proportional", t_fwd=20.0),
                          checkpoint_policy=CheckpointPolicy(**FAST_SAVES)), timeout_s, EMULATED_IMG_STEPS,
             img_max_nodes=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], float(a[1]) if len(a) > 1 else 300.0, a[2] if len(a) > 2 else None, int(a[3]) if len(a) > 3 else 600)
