"""The training beside a facility replay (benchmarks/facility_replay.py): the two jobs of the EMULATED
ACCELERATOR it runs (``Emulated``), and what they did, read from the run's state directory (``read_training``).

The emulated accelerator (parsl_bft/train/emulated.py) sleeps ``sample_ms`` per sample of a rank's share of the
global batch: a sleep stands in for the GPU, the gloo all-reduces and HDF5 checkpoints are real. Its scaling
curve is known exactly, so "samples trained / what the same jobs train on dedicated nodes" is exact. The step's
length matters to the facility: a facility job that claims a pilot's node waits for the step in flight (the
fragment stops at a step's end and saves), and a 1-node step is the longest one.
"""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from parsl_bft.execution.jobstore import JobStore
from parsl_bft.train.emulated import dedicated_rate

RELAUNCH_S = 5.0                # a fragment launched within this of the job's last one's end: a resize


@dataclass(frozen=True)
class Emulated:
    """The emulated jobs: 840 = lcm(1..8), so every size a job may take divides the batch: rate(n) = n * rate(1).
    A 1-node step takes 1.0 s, 8 nodes' 0.13 s: measured data-parallel steps of BERT, DeepSpeech2, YOLOv3 and
    ResNet-50 take 0.5-1.6 s (medians; ../shared/data/scaling/pollux_osdi21_throughput.csv)."""

    sample_ms: float = 1.2
    batch: int = 840
    max_nodes: int = 8
    params_mb: float = 1.0

    def rate(self, nodes: int = 1) -> float:
        """Samples/s the jobs train on ``nodes`` dedicated nodes."""
        return dedicated_rate(nodes, self.batch, self.sample_ms)

    def step_s(self, nodes: int = 1) -> float:
        """A step's compute on ``nodes`` nodes."""
        return self.batch / self.rate(nodes)

    def describe(self) -> str:
        return (f"emulated accelerator: {self.sample_ms:g} ms/sample/rank (a 1-node step {self.step_s():.2f} s), "
                f"{self.params_mb:g} MB all-reduce, global batch {self.batch}, 2 jobs of 1-{self.max_nodes} nodes")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Emulated:
        """What a run wrote (``save``); a run from before it was written used 3 ms a sample."""
        return cls(**json.loads(path.read_text())) if path.exists() else cls(sample_ms=3.0)


@dataclass
class Training:
    """What the training beside the stream did, from its state directory (times in s from the replay's t0)."""

    samples: float                               # trained within the window
    train_node_s: float                          # node-seconds ranks trained within the window
    fragments: list[tuple[float, float, int]]    # (start, end, nodes) of each fragment's training
    restart_s: float                             # median launch -> training of a fragment
    restore_s: float                             # ... of which restoring (workload, checkpoint)
    rendezvous_s: float                          # ... and the process group's rendezvous
    save_s: float                                # median save at a fragment's stop
    failed: int
    pause_s: float = 0.0                         # median pause of a resize: last step -> the next fragment's first


def read_training(state: Path, t0: float, window_s: float, batch: int) -> Training:
    """The fragments of ``state``'s run within [0, window_s] (``batch``: the jobs' global batch)."""
    db = JobStore(state / "state.sqlite", readonly=True)
    frags, samples, node_s, launch, saves = [], 0.0, 0.0, [], []
    done = [e for _, _, e in db.events("fragment-done")]
    for e in done:
        a, b = e["train_started"] - t0, e["train_started"] - t0 + e["train_s"]
        inside = max(0.0, min(b, window_s) - max(a, 0.0))
        share = inside / (b - a) if b > a else 0.0
        samples += share * (e.get("samples") or 0)
        node_s += inside * e["size"]
        frags.append((a, b, e["size"]))
        launch.append(e["train_started"] - e["launched"])
        saves.append(e["checkpoint_s"])
    failed = db.events("fragment-failed")
    for _, _, e in failed:                       # what a failed fragment saved before it died still counts
        samples += max(0, e["saved_step"] - e["resume_step"]) * batch

    def median(xs: list[float]) -> float:
        return statistics.median(xs) if xs else 0.0
    return Training(samples, node_s, frags, median(launch), median([e.get("restore_s") or 0.0 for e in done]),
                    median([e.get("rendezvous_s") or 0.0 for e in done]), median(saves), len(failed),
                    median(resize_pauses(done)))


def resize_pauses(done: list[dict]) -> list[float]:
    """Each job's pause between a fragment's last step and the next one's first, where the next was launched
    as the last was collected (a resize: stop, save, collect, plan, launch, restore, rendezvous), not later
    for want of nodes: what the simulator's restart cost stands for."""
    out = []
    for job in {e["job"] for e in done}:
        mine = sorted((e for e in done if e["job"] == job), key=lambda e: e["launched"])
        for a, b in itertools.pairwise(mine):
            if a.get("ended") is not None and b["launched"] - a["ended"] <= RELAUNCH_S:
                out.append(b["train_started"] - (a["train_started"] + a["train_s"]))
    return out
