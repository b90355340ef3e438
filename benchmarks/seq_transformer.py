"""A small transformer encoder on made-up sequences (nothing downloaded) for benchmarks/freezing.py and
benchmarks/freeze_calibration.py: a layer structure unlike the digits CNN's - an embedding, ``depth`` encoder
layers of equal compute and parameters, and a pooled linear head.

The task: each of ``classes`` classes is a random prototype sequence of ``length`` tokens over ``vocab``; a
sample is its class's prototype with each token replaced by a random one with probability ``noise``, rolled by
a random shift (so the class is in which tokens follow which, not in where they stand). The made set is fixed
by ``data_seed``, its train / validation / test split by the workload's ``seed``."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from parsl_bft.train.workloads import Workload

SPLITS = ("train", "val", "test")


def made_sequences(n: int = 1500, classes: int = 8, length: int = 16, vocab: int = 24, noise: float = 0.5,
                   data_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, length], labels [n]): the task of the module docstring."""
    rng = np.random.default_rng(data_seed)
    protos = rng.integers(vocab, size=(classes, length))
    y = rng.integers(classes, size=n)
    x = protos[y]
    swap = rng.random(x.shape) < noise
    x = np.where(swap, rng.integers(vocab, size=x.shape), x)
    shift = rng.integers(length, size=n)
    x = np.stack([np.roll(row, s) for row, s in zip(x, shift)])
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def split(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Indices of a 60 / 20 / 20 train / validation / test split fixed by ``seed``."""
    order = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    a, b = int(0.6 * n), int(0.8 * n)
    return {"train": order[:a], "val": order[a:b], "test": order[b:]}


class _Embed(nn.Module):
    def __init__(self, vocab: int, length: int, width: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(1, length, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos


class _Head(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(h).mean(1))


class SeqTransformer(Workload):
    """The made-sequence classifier (module doc); blocks: embedding, ``depth`` encoder layers, head."""

    name = "seq-transformer"

    def __init__(self, width: int = 32, depth: int = 4, lr: float = 0.05, n: int = 1500, **kw):
        super().__init__(lr=lr, **kw)
        self.width, self.depth, self.n = width, depth, n
        self.classes, self.length, self.vocab = 8, 16, 24

    def dataset(self, split_name: str = "train") -> TensorDataset:
        x, y = made_sequences(self.n, self.classes, self.length, self.vocab)
        idx = split(self.n, self.seed)[split_name]
        return TensorDataset(x[idx], y[idx])

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        w = self.width
        layers = [nn.TransformerEncoderLayer(w, 4, 2 * w, dropout=0.0, batch_first=True) for _ in range(self.depth)]
        return nn.Sequential(_Embed(self.vocab, self.length, w), *layers, _Head(w, self.classes))

    def build_optimizer(self, params):
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)
