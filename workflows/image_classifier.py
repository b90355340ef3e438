"""Train two image classifiers on whatever idle nodes the site has.

Run it:   parsl-bft run workflows/image_classifier.py                        (the embedded default: this machine)
          parsl-bft run workflows/image_classifier.py --site site_configs/local-slurm.yaml    (Slurm pilots)
          parsl-bft run workflows/image_classifier.py --site A.yaml --site B.yaml            (two sites at once)
Copy it, swap in your own model (see workflows/my_model.py).
"""
from parsl_bft.execution import TrainingJob, training_session


def main(state_dir: str = "bft-state/image_classifier") -> dict:
    with training_session(state_dir) as trainer:           # the site(s) given to `parsl-bft run --site`
        small = trainer.submit(TrainingJob("cnn-small", workload="images", samples=200_000, max_nodes=2,
                                           workload_args={"n": 4096, "width": 16}))
        wide = trainer.submit(TrainingJob("cnn-wide", workload="images", samples=120_000, max_nodes=3,
                                          workload_args={"n": 4096, "width": 32}))
        trainer.run()
        # each future resolves to the job's final HDF5 checkpoint
        return {"cnn-small": small.result(), "cnn-wide": wide.result()}


if __name__ == "__main__":
    print(main())
