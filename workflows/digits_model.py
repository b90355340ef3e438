"""The model of workflows/digits_sweep.py: an MLP on scikit-learn's digits (8x8 images, 10 classes; the data
ships inside scikit-learn, nothing is downloaded). An ordinary map-style Dataset, as a scientist writes it."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from parsl_bft.train.workloads import Workload


def prepare_digits(path: str, seed: int = 0) -> str:
    """Standardised features, an 80/20 split fixed by ``seed``; written to ``path`` (.npz). Returns the path."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    mean, std = x[order[:cut]].mean(0), x[order[:cut]].std(0) + 1e-3
    x = (x - mean) / std
    np.savez(path, x_train=x[order[:cut]], y_train=d.target[order[:cut]], x_test=x[order[cut:]],
             y_test=d.target[order[cut:]])
    return path


class Split(Dataset):
    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i: int):
        return torch.from_numpy(self.x[i]), int(self.y[i])


class Digits(Workload):
    name = "digits"

    def __init__(self, data: str, width: int = 64, lr: float = 0.05, **kw):
        super().__init__(lr=lr, **kw)
        self.data, self.width = data, width

    def dataset(self, split: str = "train") -> Dataset:
        with np.load(self.data) as f:
            return Split(f[f"x_{split}"], f[f"y_{split}"])

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return nn.Sequential(nn.Linear(64, self.width), nn.ReLU(), nn.Linear(self.width, self.width), nn.ReLU(),
                             nn.Linear(self.width, 10))


def accuracy(checkpoint: str, **workload_args) -> float:
    """Held-out accuracy of a trained checkpoint."""
    from parsl_bft.train.checkpoint import load_checkpoint

    wl = Digits(**workload_args)
    model = wl.build_model()
    model.load_state_dict(load_checkpoint(checkpoint).model)
    test = wl.dataset("test")
    with torch.no_grad():
        pred = model(torch.from_numpy(test.x)).argmax(1).numpy()
    return float((pred == test.y).mean())
