"""Write a small state directory with the orchestrator of this checkout, on simulated time (no Parsl, no ranks):
job ``ok`` finishes, ``bad`` fails in a crash loop, ``cut`` is stopped by the run's time cap after a reclaim
notice moved it to fewer nodes; ``ok`` has a measured curve and ``cut`` the
site it last ran at. Its database keeps the store's layout of the commit that ran this (see
tests/data/README.md): ``PYTHONPATH=. python tests/data/statedirs/make_statedir.py tests/data/statedirs/vN``."""
import shutil
import sys
from pathlib import Path

from parsl_bft.execution.clock import SimulatedClock
from parsl_bft.execution.orchestrator import TrainingJob
from tests.unit.test_orchestrator_sim_time import RATE, ScriptedPool, SimulatedFragments, _orchestrator


def main(out: Path) -> None:
    work = out.parent / f".{out.name}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700, parents=True)
    clock = SimulatedClock()
    pool = ScriptedPool(clock, [(0, "join", ("a", "b", "c")), (60, "notice", ("c",)), (63, "leave", ("c",))])
    orch = _orchestrator(work, clock, pool, SimulatedFragments(clock, crash=("bad",)), max_failures=2)
    orch.submit(TrainingJob("ok", samples=4_000, max_nodes=1, global_batch=8, rate_guess=RATE))
    orch.submit(TrainingJob("bad", samples=1_000, max_nodes=1, global_batch=8, rate_guess=RATE))
    orch.submit(TrainingJob("cut", samples=10**6, min_nodes=1, max_nodes=2, global_batch=8, rate_guess=RATE))
    orch.run(timeout_s=200)
    # per-job facts the simulated fragments do not produce: a measured curve, the site a job last ran at
    orch.db.measured("ok", 1, 95.0)
    orch.db.measured("ok", 2, 180.0)
    orch.db.set_meta("site:cut", next(iter(orch.sites)))
    orch.close()
    state = work / "state"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(mode=0o700, parents=True)
    # what status reads: the database (checkpointed into one file) and the jobs' progress reports
    shutil.copy(state / "state.sqlite", out / "state.sqlite")
    for p in sorted((state / "jobs").glob("*/progress.json")):
        (out / p.parent.relative_to(state)).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, out / p.relative_to(state))
    shutil.rmtree(work)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
