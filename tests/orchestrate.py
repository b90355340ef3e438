"""A small orchestrated run, started as a separate process by the tests (so it can be killed and restarted).

usage: python tests/orchestrate.py STATE_DIR [TIMEOUT_S]
"""
import json
import sys

import parsl

from parsl_bft.execution import EmulatedPool, Orchestrator, TrainingJob, local_config
from parsl_bft.planner import Planner

JOBS = [TrainingJob("img", workload="images", samples=32 * 600, min_nodes=1, max_nodes=2, global_batch=32,
                    workload_args={"n": 512}, rate_guess=3000.0),
        TrainingJob("lm", workload="lm", samples=16 * 200, min_nodes=1, max_nodes=2, global_batch=16,
                    workload_args={"n_chars": 20_000}, rate_guess=300.0)]


def main(state_dir: str, timeout_s: float = 300.0) -> None:
    # two nodes, every 30 s: node0 idle for 10 s, node1 for 20 s; each leaves after a 2 s notice
    pool = EmulatedPool.pattern(nodes=2, period_s=30.0, cycles=1000, notice_s=2.0)
    with parsl.load(local_config(workers=4, run_dir=f"{state_dir}/runinfo")):
        orch = Orchestrator(state_dir, pool, Planner(method="dp", objective="proportional", t_fwd=20.0))
        futs = {j.name: orch.submit(j) for j in JOBS}
        summary = orch.run(timeout_s=timeout_s)
        results = {n: f.result() if f.done() else None for n, f in futs.items()}
        print(json.dumps({"summary": summary, "results": results}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 300.0)
