"""A scientist's workflow submitted through Globus Compute in the tests: one small job of the model file it
names (tiny_model.py, shipped with it). Arguments: training steps, and the model's hold file (see tiny_model)."""
import sys
from pathlib import Path

from parsl_bft.execution import TrainingJob, training_session

HERE = Path(__file__).resolve().parent
STEPS, HOLD = int(sys.argv[1]), sys.argv[2]

with training_session("bft-state/tiny", warm_up=False) as trainer:     # one tiny job: nothing to warm up
    done = trainer.submit(TrainingJob("tiny", workload=f"{HERE / 'tiny_model.py'}:Tiny", samples=32 * STEPS,
                                      global_batch=32, max_nodes=1, rate_guess=3000.0,
                                      workload_args={"hold": HOLD}))
    print("final checkpoint:", done.result())
