"""Bring your own training loop: an ordinary PyTorch script (a map-style Dataset, an MLP, SGD, a DataLoader-style
collate) that trains on idle nodes with nothing changed but the `ctx` calls (parsl_bft.train.context).

Run it:   parsl-bft run workflows/digits_loop.py          (the embedded default: this machine)
LAST line: {"accuracy": ..., "steps": ...}: held-out accuracy of the final model (scikit-learn's digits, offline).
"""
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

GLOBAL_BATCH = 64
SAMPLES = 1437 * 12            # 12 epochs of the training split


class Digits(Dataset):
    """scikit-learn's 8x8 digits (shipped inside the wheel): item i -> (pixels, label)."""

    def __init__(self, split: str = "train"):
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        cut = 1437                                        # the first 80 % train, the rest is held out
        sl = slice(0, cut) if split == "train" else slice(cut, None)
        self.x = torch.tensor(x[sl] / 16.0, dtype=torch.float32)
        self.y = torch.tensor(y[sl], dtype=torch.long)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_model(width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def train(ctx):
    data = Digits("train")
    model = make_model(ctx.args.get("width", 64)).to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=ctx.args.get("lr", 0.1), momentum=0.9)
    if ctx.restored is not None:
        model.load_state_dict(ctx.restored["model"])
        opt.load_state_dict(ctx.restored["optimizer"])
    net = ctx.distributed(model)
    for idx in ctx.batches(len(data)):
        x, y = default_collate([data[int(i)] for i in idx])
        loss = nn.functional.cross_entropy(net(x.to(ctx.device)), y.to(ctx.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(loss=loss.item())
        if ctx.should_stop():
            break
        if ctx.should_save():
            ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})
    ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})


def accuracy(checkpoint: str, width: int = 64) -> float:
    from parsl_bft.train.checkpoint import load_checkpoint
    model = make_model(width)
    model.load_state_dict(load_checkpoint(checkpoint).model["model"])
    test = Digits("test")
    with torch.no_grad():
        return float((model(test.x).argmax(1) == test.y).float().mean())


def main(state_dir: str = "bft-state/digits_loop") -> dict:
    from parsl_bft.execution import TrainingJob, training_session
    with training_session(state_dir) as trainer:
        fut = trainer.submit(TrainingJob("digits-loop", loop=f"{Path(__file__).resolve()}:train", samples=SAMPLES,
                                         global_batch=GLOBAL_BATCH, max_nodes=2, rate_guess=5000.0))
        checkpoint = fut.result()
    return {"accuracy": accuracy(checkpoint), "steps": -(-SAMPLES // GLOBAL_BATCH)}


if __name__ == "__main__":
    print(json.dumps(main()))
