"""A scientist's own workload: subclass Workload and override what differs from the defaults."""
import torch
from torch import nn
from torch.utils.data import TensorDataset

from parsl_bft.train.workloads import TinyLM, generate_text


class ShakespeareLikeLM(TinyLM):
    """TinyLM with a bigger context, a 3-layer model and its own corpus (made here, nothing downloaded)."""

    def __init__(self, seed: int = 0, **kw):
        super().__init__(seed=seed, lr=2e-3, n_chars=60_000, context=48, dim=64, layers=3, heads=4, **kw)
        self.text = generate_text(self.n_chars, seed + 7).upper()
        self.vocab = sorted(set(self.text))

    def dataset(self):
        ids = torch.tensor([self.vocab.index(c) for c in self.text])
        n = (len(ids) - 1) // self.context
        return TensorDataset(ids[: n * self.context].view(n, -1), ids[1: n * self.context + 1].view(n, -1))

    def build_optimizer(self, params):
        return torch.optim.Adam(params, lr=self.lr)

    def loss(self, model: nn.Module, batch):
        x, y = batch
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                           label_smoothing=0.05)
