"""A user's own model file (shipped with tiny_train.py): the synthetic image classifier, small.

``hold``: a test's handle on time, not on results - while that file exists, training waits before its step
``hold_at`` (and says so in ``hold + '.held'``), so a test can act on a run that is surely mid-training."""
import os
import time

from parsl_bft.train.workloads import SyntheticImages


class Tiny(SyntheticImages):
    def __init__(self, hold: str = "", hold_at: int = 5, **kw):
        super().__init__(**{"n": 256, "width": 8, **kw})
        self.hold, self.hold_at, self.calls = hold, hold_at, 0
        print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)   # in the rank's log

    def loss(self, model, batch):
        self.calls += 1
        if self.hold and self.calls > self.hold_at and os.path.exists(self.hold):
            open(self.hold + ".held", "w").close()
            while os.path.exists(self.hold):
                time.sleep(0.02)
        return super().loss(model, batch)
