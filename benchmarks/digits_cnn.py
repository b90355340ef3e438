"""A small CNN on scikit-learn's digits (8x8 images shipped inside scikit-learn, upsampled to ``size`` x ``size``;
nothing is downloaded) for benchmarks/freezing.py: five layers, most of the compute in the convolutions (as in
image CNNs), most of the parameters in the last two. scikit-learn is imported at the top so that a forkserver
that preloads the benchmark has it already (ranks then load the data in milliseconds)."""
import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from parsl_bft.train.workloads import Workload


def digits_split(seed: int = 0, size: int = 16) -> dict[str, torch.Tensor]:
    """Standardised size x size images, a 60/20/20 train / validation / test split fixed by ``seed`` (the
    validation split sets a target accuracy, the test split reports the accuracy reached)."""
    d = load_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32))[:, None]
    x = nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std()
    y = torch.from_numpy(d.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    a, b = int(0.6 * len(y)), int(0.8 * len(y))
    parts = {"train": order[:a], "val": order[a:b], "test": order[b:]}
    return {f"{k}_{s}": v[i] for s, i in parts.items() for k, v in (("x", x), ("y", y))}


class DigitsCNN(Workload):
    name = "digits-cnn"

    def __init__(self, width: int = 32, lr: float = 0.02, size: int = 16, **kw):
        super().__init__(lr=lr, **kw)
        if size < 16 or size % 4:
            raise ValueError(f"size: a multiple of 4, at least 16 (pixels), got {size}")
        self.width, self.size = width, size

    def dataset(self, split: str = "train") -> TensorDataset:
        d = digits_split(self.seed, size=self.size)
        return TensorDataset(d[f"x_{split}"], d[f"y_{split}"])

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        w = self.width
        return nn.Sequential(
            nn.Sequential(nn.Conv2d(1, w, 3, padding=1), nn.ReLU()),
            nn.Sequential(nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
            # pooled to 4x4 whatever the size (identity at 16): larger images add compute, not parameters
            nn.Sequential(nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(4)),
            nn.Sequential(nn.Flatten(), nn.Linear(2 * w * 16, 128), nn.ReLU()),
            nn.Linear(128, 10),
        )


def accuracy(checkpoint: str, split: str = "test", **workload_args) -> float:
    """Accuracy of a checkpoint on a held-out split ("val" or "test")."""
    from parsl_bft.train.checkpoint import load_checkpoint

    wl = DigitsCNN(**workload_args)
    model = wl.build_model()
    model.load_state_dict(load_checkpoint(checkpoint).model)
    model.eval()
    test = wl.dataset(split)
    with torch.no_grad():
        return float((model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean())
