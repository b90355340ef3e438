"""A hyper-parameter sweep on real data, offline, as one Parsl pipeline of futures:
prepare (scikit-learn's digits) -> train 4 configurations on idle nodes -> evaluate each -> pick the best.

Run it:   parsl-bft run workflows/digits_sweep.py            (the embedded default: this machine)
          parsl-bft run workflows/digits_sweep.py --site site_configs/local-slurm.yaml
LAST line: {"best_accuracy": ..., "configs": 4, "best": ...}; the held-out accuracy must reach 0.9.
"""
import json
from pathlib import Path

from parsl import python_app

from parsl_bft.execution import TrainingJob, training_session

HERE = Path(__file__).resolve().parent
MODEL = f"{HERE / 'digits_model.py'}:Digits"
CONFIGS = [dict(width=32, lr=0.05), dict(width=64, lr=0.1), dict(width=64, lr=0.05, schedule="cosine"),
           dict(width=128, lr=0.1, schedule="cosine", warmup=0.1)]
THRESHOLD = 0.9


# apps travel to workers by value: they import what they use themselves. They run on the session's "login"
# executor (this machine): on a batch system the only other one is the pilots', which come for training only
@python_app(executors=["login"])
def prepare(here: str, path: str) -> str:
    import sys
    sys.path.insert(0, here)
    from digits_model import prepare_digits
    return prepare_digits(path)


@python_app(executors=["login"])
def evaluate(here: str, checkpoint: str, data: str, config: dict) -> float:
    import sys
    sys.path.insert(0, here)
    from digits_model import accuracy
    return accuracy(checkpoint, data=data, **config)


def main(state_dir: str = "bft-state/digits") -> dict:
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    with training_session(state_dir) as trainer:          # the site(s) given to `parsl-bft run --site`
        data = prepare(str(HERE), str(Path(state_dir).resolve() / "digits.npz"))
        scores = {}
        for i, config in enumerate(CONFIGS):
            job = TrainingJob(f"digits-{i}", workload=MODEL, samples=1437 * 15, global_batch=64, max_nodes=2,
                              rate_guess=5000.0, workload_args={"data": data, **config})   # data: a future
            scores[job.name] = evaluate(str(HERE), trainer.submit(job), data, config)
        accuracy = {name: s.result() for name, s in scores.items()}
    best = max(accuracy, key=accuracy.get)
    out = {"best_accuracy": accuracy[best], "configs": len(CONFIGS), "best": best, "accuracy": accuracy}
    assert out["best_accuracy"] >= THRESHOLD, out
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
