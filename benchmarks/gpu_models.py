"""The models of benchmarks/gpu.py and the one training step both of its arms run: a plain PyTorch loop, and a
parsl-bft fragment (``train(ctx)``, a scientist's own loop). Synthetic data made on the device: the measurement
is the training, not a data pipeline.

- resnet50: torchvision's ResNet-50 layout (bottlenecks 3-4-6-3), written out here (torchvision is not a
  dependency); 224x224 images, 1000 classes; bf16 autocast, channels-last.
- gpt2-medium: a GPT-2-medium-size decoder (24 layers, d=1024, 16 heads, 1024 tokens, 50257-token vocabulary);
  bf16 autocast.
- resnet-tiny, gpt-tiny: the same code, small enough for a CPU (`gpu.py --smoke`, what CI runs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet(base: int = 64, blocks: tuple[int, ...] = (3, 4, 6, 3), classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = base
    for i, n in enumerate(blocks):
        width = base * 2 ** i
        for j in range(n):
            layers.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class GPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        block = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


@dataclass(frozen=True)
class Spec:
    """A model of the benchmark: how to build it and a batch of its synthetic data."""

    name: str
    kind: str                  # image | text
    size: int                  # image side, or tokens per sample
    classes: int               # classes, or vocabulary
    build: Any

    def batch(self, n: int, device: torch.device, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator(device="cpu").manual_seed(n)
        if self.kind == "image":
            x = torch.randn(n, 3, self.size, self.size, generator=g).to(device)
            x = x.to(memory_format=torch.channels_last) if channels_last else x
            return x, torch.randint(0, self.classes, (n,), generator=g).to(device)
        tokens = torch.randint(0, self.classes, (n, self.size + 1), generator=g).to(device)
        return tokens[:, :-1], tokens[:, 1:]


SPECS = {
    "resnet50": Spec("resnet50", "image", 224, 1000, lambda: resnet()),
    "gpt2-medium": Spec("gpt2-medium", "text", 1024, 50257, lambda: GPT(50257, 1024, 1024, 24, 16)),
    "resnet-tiny": Spec("resnet-tiny", "image", 32, 10, lambda: resnet(8, (1, 1, 1, 1), 10)),
    "gpt-tiny": Spec("gpt-tiny", "text", 32, 256, lambda: GPT(256, 32, 64, 2, 4)),
}


def build(name: str, device: torch.device, channels_last: bool, compile_model: bool
          ) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """(the model to call, the model whose state is saved, its optimizer), seeded alike in both arms."""
    spec = SPECS[name]
    torch.manual_seed(0)
    with device:                                  # built on the device: no CPU initialisation, no copy
        model = spec.build()
    if channels_last and spec.kind == "image":
        model = model.to(memory_format=torch.channels_last)
    opt: torch.optim.Optimizer = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if spec.kind == "image"
                                  else torch.optim.AdamW(model.parameters(), lr=1e-4))
    run = torch.compile(model) if compile_model else model
    return run, model, opt    # type: ignore[return-value]


def step(name: str, run: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
         bf16: bool) -> torch.Tensor:
    """One training step: forward under bf16 autocast (where asked), loss, backward, optimizer step."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = run(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


WARMUP = 5     # steps before the steady-state timer starts, in both arms


def train(ctx: Any) -> None:
    """The parsl-bft arm: the same step as a fragment (``ctx.args``: model, batch, bf16, channels_last,
    compile). Reports the first step's time (``first_step_s``: compile and warm-up are part of a restart) and,
    after WARMUP steps, the steady rate (``steady_samples_s``, as the plain arm times it: per-step overhead of the
    runtime included, warm-up not)."""
    a = ctx.args
    run, model, opt = build(a["model"], ctx.device, a["channels_last"], a["compile"])
    if ctx.restored is not None:
        model.load_state_dict(ctx.restored["model"])
        opt.load_state_dict(ctx.restored["optimizer"])
    x, y = SPECS[a["model"]].batch(ctx.global_batch // ctx.world_size, ctx.device, a["channels_last"])
    n, t_steady = 0, 0.0
    while True:
        t = time.perf_counter()
        loss = step(a["model"], run, opt, x, y, a["bf16"]).item()        # .item(): the step finished
        n += 1
        if n == 1:
            ctx.report(loss=loss, first_step_s=time.perf_counter() - t)
        elif n > WARMUP:
            ctx.report(loss=loss, steady_samples_s=(n - WARMUP) * x.shape[0] / (time.perf_counter() - t_steady))
        else:
            ctx.report(loss=loss)
        if n == WARMUP:
            t_steady = time.perf_counter()
        if ctx.should_stop():
            break
    ctx.save({"model": model.state_dict(), "optimizer": opt.state_dict()})
