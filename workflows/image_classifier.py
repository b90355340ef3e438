"""Train two image classifiers on whatever idle nodes the site has.

Run it:   parsl-bft run workflows/image_classifier.py            (the embedded default: this machine)
Copy it, swap in your own model (see workflows/my_model.py) and your site's config.
"""
import parsl

from parsl_bft.execution import EmulatedPool, Orchestrator, TrainingJob, local_config
from parsl_bft.planner import Planner


def main(state_dir: str = "bft-state/image_classifier") -> dict:
    with parsl.load(local_config(run_dir=f"{state_dir}/runinfo")):
        trainer = Orchestrator(state_dir, EmulatedPool.demo(speedup=30, repeat=True),
                               Planner(method="milp", objective="speedup", t_fwd=20.0))
        small = trainer.submit(TrainingJob("cnn-small", workload="images", samples=200_000, max_nodes=2,
                                           workload_args={"n": 4096, "width": 16}))
        wide = trainer.submit(TrainingJob("cnn-wide", workload="images", samples=120_000, max_nodes=3,
                                          workload_args={"n": 4096, "width": 32}))
        trainer.run()
        # each future resolves to the job's final HDF5 checkpoint
        return {"cnn-small": small.result(), "cnn-wide": wide.result()}


if __name__ == "__main__":
    print(main())
