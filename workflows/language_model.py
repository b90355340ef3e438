"""Train a small transformer language model on idle nodes, using your own model code.

The workload is named by file and factory ("path/to/file.py:Factory"); my_model.py shows the interface: the model,
the dataset, the loss, the optimizer. Run it:   parsl-bft run workflows/language_model.py
"""
from pathlib import Path

import parsl

from parsl_bft.execution import EmulatedPool, Orchestrator, TrainingJob, local_config
from parsl_bft.planner import Planner

MY_MODEL = f"{Path(__file__).resolve().parent / 'my_model.py'}:ShakespeareLikeLM"


def main(state_dir: str = "bft-state/language_model") -> str:
    with parsl.load(local_config(run_dir=f"{state_dir}/runinfo")):
        trainer = Orchestrator(state_dir, EmulatedPool.demo(speedup=30, repeat=True),
                               Planner(method="dp", objective="speedup", t_fwd=20.0))
        lm = trainer.submit(TrainingJob("my-lm", workload=MY_MODEL, samples=8_000,
                                        max_nodes=2, global_batch=32, rate_guess=400.0))
        trainer.run()
        return lm.result()


if __name__ == "__main__":
    print(main())
