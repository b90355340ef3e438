"""Train a small transformer language model on idle nodes, using your own model code.

The workload is named by file and factory ("path/to/file.py:Factory"); my_model.py shows the interface: the model,
the dataset, the loss, the optimizer. Run it:   parsl-bft run workflows/language_model.py [--site SITE.yaml]
"""
from pathlib import Path

from parsl_bft.execution import TrainingJob, training_session

MY_MODEL = f"{Path(__file__).resolve().parent / 'my_model.py'}:ShakespeareLikeLM"


def main(state_dir: str = "bft-state/language_model") -> str:
    with training_session(state_dir) as trainer:           # the site(s) given to `parsl-bft run --site`
        lm = trainer.submit(TrainingJob("my-lm", workload=MY_MODEL, samples=8_000,
                                        max_nodes=2, global_batch=32, rate_guess=400.0))
        trainer.run()
        return lm.result()


if __name__ == "__main__":
    print(main())
