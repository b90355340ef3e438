"""The fragment's side of layer elasticity: freezing a prefix of the model's layers, carrying optimizer state
across freeze levels, and the per-layer gradient statistics the planner's penalty model reads
(planner/freeze.py). A layer is one entry of ``Workload.blocks(model)``.

A frozen layer has requires_grad off and is in eval mode (its normalisation statistics stop too): backward stops
at the first trainable layer, DDP registers only trainable parameters (nothing of the prefix is all-reduced) and
the optimizer never sees the prefix, so its weights stay bit-for-bit what the checkpoint had.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import BadValue

INTERVAL = 50            # steps per statistics interval (FragmentConfig.grad_stats_interval)
SAMPLES_PER_INTERVAL = 10    # gradient samples per interval: enough to tell a consistent gradient from noise


def freeze_prefix(model: nn.Module, blocks: list[nn.Module], k: int) -> list[nn.Parameter]:
    """Freeze the first k blocks; returns the parameters left to train, in model order."""
    if not 0 <= k < max(len(blocks), 1) or (k and len(blocks) < 2):
        raise BadValue(f"freeze_layers={k}: the model has {len(blocks)} layer(s) and at least one must train")
    frozen = {id(p) for b in blocks[:k] for p in b.parameters()}
    for b in blocks[:k]:
        b.eval()
        for p in b.parameters():
            p.requires_grad_(False)
    return [p for p in model.parameters() if id(p) not in frozen]


def _names_in_optimizer_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    name = {id(p): n for n, p in model.named_parameters()}
    return [name[id(p)] for g in optimizer.param_groups for p in g["params"]]


def carry_optimizer_state(saved: dict[str, Any], model: nn.Module, blocks: list[nn.Module], saved_level: int,
                          optimizer: torch.optim.Optimizer,
                          build_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
                          ) -> dict[str, Any]:
    """``saved`` (an optimizer state_dict written at ``saved_level``) renumbered for ``optimizer``, built at the
    current level: parameters trainable at both levels keep their state (momentum, Adam moments), newly
    unfrozen ones start fresh, newly frozen ones drop theirs; hyperparameters (a schedule's lr) carry over."""
    frozen_then = {id(p) for b in blocks[:saved_level] for p in b.parameters()}
    then = build_optimizer([p for p in model.parameters() if id(p) not in frozen_then])
    old_index = {n: i for i, n in enumerate(_names_in_optimizer_order(model, then))}
    out = optimizer.state_dict()
    state = {}
    for j, n in enumerate(_names_in_optimizer_order(model, optimizer)):
        i = old_index.get(n)
        if i is not None and i in saved["state"]:
            state[j] = saved["state"][i]
    groups = []
    for gi, g in enumerate(out["param_groups"]):
        old = saved["param_groups"][min(gi, len(saved["param_groups"]) - 1)]
        groups.append({**{k: v for k, v in old.items() if k != "params"}, "params": g["params"]})
    return {"state": state, "param_groups": groups}


class GradRecorder:
    """Per-layer gradient statistics over intervals of ``interval`` steps, sampled every ``every`` steps (about
    ten samples an interval; a sample is a few passes over the gradients and one model-sized running sum: cheap
    next to a backward pass), for the planner's penalty model:

    - ``now`` / ``prev``: the L1 norm of the layer's gradient summed over the last / the previous interval;
    - ``signal`` / ``signal_prev``: the share of the layer's gradient energy that is consistent from step to
      step rather than minibatch noise, rho = (|sum g|^2 - sum |g|^2) / ((T - 1) sum |g|^2) over the T samples
      of the last / the previous interval: E[rho] = |mu|^2 / (|mu|^2 + sigma^2) for gradients g = mu + noise,
      so ~0 for a layer whose gradients cancel (settled: training it moves it nowhere) and ~1 for one pulled
      one way (still learning);
    - ``energy``: the mean |g|^2 over the last interval's samples (rho * energy estimates |mu|^2: SGD's
      first-order loss decrease from the layer is lr |mu|^2, so it weighs the layer's part in the progress).

    Frozen layers keep the values they had when they were frozen. ``state()`` goes into the checkpoint (a
    partial interval does not: the running gradient sum is the size of the model; a restored fragment starts a
    fresh interval); ``report()`` is what the planner reads."""

    KEYS = ("prev", "now", "signal_prev", "signal", "energy")

    def __init__(self, blocks: list[nn.Module], frozen: int, restored: dict[str, Any] | None = None,
                 every: int | None = None, interval: int = INTERVAL) -> None:
        self.blocks, self.frozen, self.interval = blocks, frozen, max(2, interval)
        self.every = max(1, min(every or max(1, self.interval // SAMPLES_PER_INTERVAL), self.interval // 2))
        n = len(blocks)
        r = restored if restored and len(restored.get("now") or []) == n else {}
        self.stats = {k: list(r.get(k) or [math.nan] * n) for k in self.KEYS}
        self._reset()

    def _reset(self) -> None:
        self.start = -1
        self.samples = 0
        self.l1 = [0.0] * len(self.blocks)
        self.sq = [0.0] * len(self.blocks)
        self.sums: list[list[torch.Tensor] | None] = [None] * len(self.blocks)

    def record(self, step: int) -> None:
        """After backward (gradients all-reduced), before the optimizer step; ``step`` counts from 0."""
        if step % self.every:
            return
        if self.start < 0:
            self.start = step
        self.samples += 1
        with torch.no_grad():
            # one fused pass over every tensor and one host sync for all the norms (per-tensor reductions cost a
            # small model 15% of its step)
            grads = {i: [p.grad.detach().reshape(-1).float() for p in self.blocks[i].parameters()
                         if p.grad is not None] for i in range(self.frozen, len(self.blocks))}
            flat = [g for gs in grads.values() for g in gs]
            norms = torch.stack([*torch._foreach_norm(flat, 1), *torch._foreach_norm(flat, 2)]).tolist() if flat else []
            l1, l2 = norms[:len(flat)], norms[len(flat):]
            at = 0
            for i, gs in grads.items():
                self.l1[i] += sum(l1[at:at + len(gs)])
                self.sq[i] += sum(x * x for x in l2[at:at + len(gs)])
                at += len(gs)
            fresh = [i for i, gs in grads.items() if self.sums[i] is None or len(self.sums[i] or []) != len(gs)]
            for i in fresh:
                self.sums[i] = [g.clone() for g in grads[i]]
            kept = [i for i in grads if i not in fresh]
            if kept:
                torch._foreach_add_([a for i in kept for a in self.sums[i] or []], [g for i in kept for g in grads[i]])
        if step - self.start + self.every >= self.interval:
            t = self.samples
            for i in range(self.frozen, len(self.blocks)):
                total = sum(float(s.square().sum()) for s in self.sums[i] or [])
                st = self.stats
                st["prev"][i], st["now"][i] = st["now"][i], self.l1[i]
                st["signal_prev"][i] = st["signal"][i]
                if t < 2:
                    st["signal"][i] = math.nan
                else:         # no gradient at all (a block without parameters) has nothing to lose
                    st["signal"][i] = (total - self.sq[i]) / ((t - 1) * self.sq[i]) if self.sq[i] > 0 else 0.0
                st["energy"][i] = self.sq[i] / t
            self._reset()

    def state(self) -> dict[str, list[float]]:
        """Every statistic per layer (what the checkpoint keeps)."""
        return {k: list(v) for k, v in self.stats.items()}

    def report(self) -> dict[str, list[float]]:
        """The statistics once two intervals of the trainable layers are complete, else {} (layers frozen before
        they had statistics stay nan: the penalty model counts them as costly)."""
        if any(math.isnan(x) for k in ("prev", "now") for x in self.stats[k][self.frozen:]):
            return {}
        return self.state()


def layer_shares(model: nn.Module, blocks: list[nn.Module], batch: Any,
                 loss_fn: Callable[[nn.Module, Any], torch.Tensor], reps: int = 10) -> dict[int, tuple[float, float]]:
    """level -> (share of a training step's compute, share of the parameters) in the first ``level`` blocks,
    for every level that leaves a block training. Compute is each block's forward time (hooks, best of
    ``reps``): a layer's backward costs about twice its forward, so forward shares are training-time shares."""
    import time

    times = [math.inf] * len(blocks)
    started: dict[int, float] = {}
    hooks = []
    for i, b in enumerate(blocks):
        hooks.append(b.register_forward_pre_hook(lambda m, a, i=i: started.__setitem__(i, time.perf_counter())))
        hooks.append(b.register_forward_hook(
            lambda m, a, o, i=i: times.__setitem__(i, min(times[i], time.perf_counter() - started[i]))))
    try:
        with torch.no_grad():
            for _ in range(reps):
                loss_fn(model, batch)
    finally:
        for h in hooks:
            h.remove()
    params = [sum(p.numel() for p in b.parameters()) for b in blocks]
    if not all(math.isfinite(x) for x in times):      # a block the forward pass never called as a module
        times = [float(x) for x in params]
    t_all, p_all = sum(times) or 1.0, max(sum(params), 1)
    out, t, p = {}, 0.0, 0
    for k in range(len(blocks)):
        out[k] = (t / t_all, p / p_all)
        t, p = t + times[k], p + params[k]
    return out
