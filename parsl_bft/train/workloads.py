"""Workloads that need no download, and the interface a scientist implements for their own model.

A workload is an object with:
  ``build_model() -> nn.Module``, ``dataset() -> Dataset`` (any map-style dataset, deterministic: item i is
  always the same; items are combined by ``collate``, torch's default_collate unless overridden),
  ``loss(model, batch) -> scalar tensor`` (the MEAN over the batch), ``build_optimizer(params)``,
  ``build_scheduler(optimizer, total_steps) -> scheduler | None`` (default: the ``schedule`` named in the
  workload's arguments - none, "cosine", "linear", "step:GAMMA@F1,F2" - stated in fractions of the whole run,
  after ``warmup`` (a fraction too); a fragment steps it once per optimizer step and checkpoints it) and
  ``blocks(model) -> list[nn.Module]`` (the model's layers in input-to-output order; layer freezing freezes
  the first L).
Subclass ``Workload`` and override what differs; pass it to a fragment as ``"package.module:factory"``.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import math
import os
import random
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from torch.utils.data import Dataset, TensorDataset, default_collate

from ..errors import ParslBftError


class WorkloadError(ParslBftError, ValueError):
    """A workload or training function that cannot be loaded or built as named (a misspelled file, class,
    function or ``workload_args`` key), or a job option its ranks cannot honour. Raised at submit where it can
    be told there; a rank that meets it fails its job without retries."""


def lr_schedule(optimizer: torch.optim.Optimizer, schedule: str | None, total_steps: int | None,
                warmup: float | str = 0.0, steps_per_epoch: int | None = None) -> LambdaLR | None:
    """A learning-rate schedule stated in fractions of the run, so it means the same whatever the job's size, or
    in epochs (a number with an ``e``: "30e"): None or "constant", "cosine" (to 0 at the end), "linear" (to 0),
    "step:GAMMA@M1,M2,..." (multiply by GAMMA at each mark: 0.5 = half-way, 30e = after 30 epochs);
    ``warmup``: the first fraction of the run (or "2e": epochs) ramps up linearly."""
    if schedule in (None, "", "constant") and not warmup:
        return None
    if total_steps is None or total_steps < 1:
        raise WorkloadError(f"schedule {schedule!r} / warmup needs the run's length: give the job its samples")

    def steps(mark: float | str) -> float:
        text = str(mark).strip()
        if text.endswith("e"):
            if not steps_per_epoch:
                raise WorkloadError(f"{text!r} is in epochs, but the dataset's length is not known here")
            return float(text[:-1]) * steps_per_epoch
        return float(text) * total_steps

    try:
        w = steps(warmup)
    except ValueError as e:
        raise WorkloadError(f"warmup {warmup!r}: a fraction of the run in [0, 1) or epochs ('2e') ({e})") from None
    if not 0 <= w < total_steps:
        raise WorkloadError(f"warmup is a fraction of the run in [0, 1) (or epochs within it), got {warmup}")
    kind, _, arg = (schedule or "constant").partition(":")
    if kind not in ("constant", "cosine", "linear", "step") or (arg and kind != "step"):
        raise WorkloadError(f"unknown schedule {schedule!r}: use constant, cosine, linear or step:GAMMA@F1,F2")
    if kind == "step":
        try:
            gamma_text, fracs = arg.split("@")
            gamma, marks = float(gamma_text), [steps(f) for f in fracs.split(",")]
        except ValueError as e:
            raise WorkloadError(f"schedule {schedule!r}: write step:GAMMA@M1,M2 (fractions of the run, e.g. "
                                f"step:0.1@0.5,0.75, or epochs, e.g. step:0.1@30e,60e): {e}") from None

    def factor(step: int) -> float:
        if step < w:
            return (step + 1) / w
        x = (step - w) / max(total_steps - w, 1)
        if kind == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(x, 1.0)))
        if kind == "linear":
            return max(1.0 - x, 0.0)
        if kind == "step":
            return gamma ** sum(step >= m for m in marks)
        return 1.0
    return LambdaLR(optimizer, factor)


class Workload:
    """The default of every part but the model and the data (the module docstring lists the parts): subclass it
    and override what differs. A subclass takes its own workload arguments as parameters and passes the rest on
    (``def __init__(self, width=64, **kw): super().__init__(**kw)``); what reaches this class unclaimed is a typo
    and is refused, naming the arguments the class takes. A subclass that reads arguments from ``self.kwargs``
    instead names them in ``extra_args`` (``("*",)``: any)."""

    name = "workload"
    extra_args: tuple[str, ...] = ()     # workload arguments kept in self.kwargs rather than taken as parameters

    def __init__(self, seed: int = 0, lr: float = 0.05, schedule: str | None = None, warmup: float | str = 0.0,
                 eval_every: int = 0, **kwargs: Any) -> None:
        unknown = sorted(k for k in kwargs if k not in self.extra_args and "*" not in self.extra_args)
        if unknown:
            raise WorkloadError(unknown_args(type(self), unknown))
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr >= 0:
            raise WorkloadError(f"{type(self).__name__}: lr is a number >= 0, got {str(lr)[:40]!r}")
        if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
            raise WorkloadError(f"{type(self).__name__}: eval_every is a number of steps >= 0, got "
                                f"{str(eval_every)[:40]!r}")
        self.seed, self.lr, self.schedule, self.warmup, self.kwargs = seed, lr, schedule, warmup, kwargs
        self.eval_every = eval_every

    def build_model(self) -> nn.Module:
        """A new model, the same on every rank (seed it)."""
        raise NotImplementedError

    def dataset(self) -> Dataset[Any]:
        """The training data: a map-style dataset whose item i is always the same."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The mean loss of one batch (default: cross entropy of ``model(x)`` against ``y``)."""
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    def build_optimizer(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """The optimizer of the trainable ``params`` (default: SGD with momentum 0.9 at ``lr``)."""
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)

    def build_scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int | None = None,
                        steps_per_epoch: int | None = None) -> LRScheduler | None:
        """No schedule unless the workload names one (see ``lr_schedule``)."""
        return lr_schedule(optimizer, self.schedule, total_steps, self.warmup, steps_per_epoch)

    eval_every: int = 0     # steps between evaluate() calls on rank 0 (0: never); a workload argument too

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out metrics (e.g. {"accuracy": ...}), every ``eval_every`` steps on rank 0, in eval mode without
        gradients; they join the step's metrics (kept in the checkpoint, passed to ``log``)."""
        return {}

    def log(self, metrics: dict[str, float]) -> None:
        """Each step's metrics on rank 0 (step, loss, world size, evaluation results): print them (the rank's
        log keeps them) or send them to your tracker."""

    def collate(self, items: list[Any]) -> Any:
        """How items of ``dataset()`` become one batch."""
        return default_collate(items)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's layers in input-to-output order (default: its children); freezing L freezes the first L."""
        return list(model.children())


class SyntheticImages(Workload):
    """Image classification on a deterministic, learnable synthetic set: each class is a smooth random
    prototype image; samples are prototypes plus noise, shifted by up to 2 pixels."""

    name = "images"

    def __init__(self, seed: int = 0, lr: float = 0.05, n: int = 4096, classes: int = 10, size: int = 16,
                 width: int = 16, noise: float = 0.8, **kw: Any) -> None:
        super().__init__(seed, lr, **kw)
        self.n, self.classes, self.size, self.width, self.noise = n, classes, size, width, noise

    def dataset(self) -> Dataset[Any]:
        """``n`` noisy, shifted copies of one smooth random prototype per class (fixed by the seed)."""
        g = torch.Generator().manual_seed(10_000 + self.seed)
        protos = torch.nn.functional.avg_pool2d(torch.randn(self.classes, 3, self.size, self.size, generator=g),
                                                3, 1, 1) * 3
        y = torch.randint(0, self.classes, (self.n,), generator=g)
        shifts = torch.randint(-2, 3, (self.n, 2), generator=g)
        x = protos[y] + self.noise * torch.randn(self.n, 3, self.size, self.size, generator=g)
        for i in range(self.n):
            x[i] = torch.roll(x[i], (int(shifts[i, 0]), int(shifts[i, 1])), (1, 2))
        return TensorDataset(x, y)

    def build_model(self) -> nn.Module:
        """Three conv blocks and a linear head (four layers to freeze)."""
        torch.manual_seed(self.seed)
        w = self.width
        return nn.Sequential(
            nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
            nn.Sequential(nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
            nn.Sequential(nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()),
            nn.Linear(2 * w, self.classes),
        )


def generate_text(n_chars: int, seed: int = 0) -> str:
    """A small synthetic language: sentences from a fixed grammar, so a model can learn real structure."""
    rng = random.Random(seed)
    subj = ["the cat", "a dog", "the model", "my node", "the scheduler", "a job", "the gpu", "our team"]
    verb = ["trains", "waits", "runs", "sleeps", "learns", "reclaims", "checkpoints", "scales"]
    obj = ["on idle nodes", "in the queue", "every night", "with gloo", "quickly", "at scale", "again", "today"]
    out, size = [], 0
    while size < n_chars:
        s = f"{rng.choice(subj)} {rng.choice(verb)} {rng.choice(obj)}. "
        out.append(s)
        size += len(s)
    return "".join(out)[:n_chars]


class TinyLM(Workload):
    """A small causal transformer language model on text generated by ``generate_text`` (characters)."""

    name = "lm"

    def __init__(self, seed: int = 0, lr: float = 3e-3, n_chars: int = 200_000, context: int = 32, dim: int = 64,
                 layers: int = 2, heads: int = 4, **kw: Any) -> None:
        super().__init__(seed, lr, **kw)
        self.n_chars, self.context, self.dim, self.layers, self.heads = n_chars, context, dim, layers, heads
        self.text = generate_text(n_chars, seed)
        self.vocab = sorted(set(self.text))

    def dataset(self) -> Dataset[Any]:
        """The text cut into ``context``-character windows, each with the next characters as its targets."""
        ids = torch.tensor([self.vocab.index(c) for c in self.text], dtype=torch.long)
        n = (len(ids) - 1) // self.context
        x = ids[: n * self.context].view(n, self.context)
        y = ids[1: n * self.context + 1].view(n, self.context)
        return TensorDataset(x, y)

    def build_model(self) -> nn.Module:
        """A small causal transformer over the text's characters."""
        torch.manual_seed(self.seed)
        return _TinyTransformer(len(self.vocab), self.context, self.dim, self.layers, self.heads)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Next-character cross entropy over every position."""
        x, y = batch
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def build_optimizer(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """AdamW at ``lr``, weight decay 0.01."""
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=0.01)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The embedding, each transformer layer, the head."""
        m = cast(_TinyTransformer, model)
        return [m.embed, *m.layers, m.head]


class _TinyTransformer(nn.Module):
    mask: torch.Tensor

    def __init__(self, vocab: int, context: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = _Embed(vocab, context, dim)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
                                    for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, vocab))
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        mask = self.mask[: x.shape[1], : x.shape[1]]
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        out: torch.Tensor = self.head(h)
        return out


class _Embed(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens: torch.Tensor = self.tok(x)
        return tokens + self.pos[: x.shape[1]]


# the built-in workloads by name; a string is loaded when first used (the emulated accelerator's module imports
# this one for Workload)
WORKLOADS: dict[str, type[Workload] | str] = {"images": SyntheticImages, "lm": TinyLM,
                                              "emulated": "parsl_bft.train.emulated:EmulatedAccelerator"}


def accepted_args(cls: type) -> list[str]:
    """The keyword arguments the constructors of ``cls`` and its bases name (what ``workload_args`` may hold)."""
    names: set[str] = set(getattr(cls, "extra_args", ()) or ()) - {"*"}
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is None or c is object:
            continue
        names |= {p.name for p in list(inspect.signature(init).parameters.values())[1:]
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return sorted(names)


def unknown_args(cls: type, unknown: list[str]) -> str:
    """One line: the workload arguments ``cls`` does not take, the nearest it does, and all it does."""
    takes = accepted_args(cls)
    hints = [f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, takes, 1)) else repr(k)
             for k in unknown]
    return (f"{cls.__name__} takes no workload_args {', '.join(hints)}; it takes: {', '.join(takes)} (a subclass "
            "reading others from self.kwargs lists them in extra_args)")


def load_attr(spec: str, what: str = "workload") -> object:
    """``'package.module:name'`` or ``'/path/to/file.py:name'``: the object it names. A file path works in every
    rank process without touching PYTHONPATH (its directory joins sys.path, so it may import its siblings)."""
    mod, _, attr = spec.rpartition(":")
    if not mod or not attr:
        raise WorkloadError(f"{what} {spec!r}: write 'package.module:name' or '/path/to/file.py:name'")
    try:
        if mod.endswith(".py"):
            folder = str(Path(mod).resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            module = _import_file(Path(mod).resolve())
        else:
            module = importlib.import_module(mod)
    except Exception as e:      # a missing module, or the file's own error (SyntaxError, NameError...): where
        raise WorkloadError(f"cannot load {what} {spec!r}: {_where(e)}{type(e).__name__}: {e}") from None
    return attr_of(module, spec, what)


def attr_of(module: ModuleType, spec: str, what: str) -> object:
    """What ``spec`` ('module:name') names in its imported ``module``; a misspelled name is refused naming the
    nearest one the module defines."""
    mod, _, attr = spec.rpartition(":")
    if not hasattr(module, attr):
        near = difflib.get_close_matches(attr, [n for n in vars(module) if not n.startswith("_")], 1)
        raise WorkloadError(f"cannot load {what} {spec!r}: {mod} defines no {attr!r}"
                            + (f" (did you mean {near[0]!r}?)" if near else ""))
    return getattr(module, attr)


def _where(e: BaseException) -> str:
    """'file.py:12: ': the innermost frame of the user's code an exception went through ("" when none)."""
    if isinstance(e, SyntaxError):      # its message says where already
        return ""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")
              and f.filename != __file__ and f"{os.sep}importlib{os.sep}" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def _import_file(path: Path) -> ModuleType:
    """The module of a user's file, imported under its own name (its folder is on sys.path): then what it
    defines pickles by reference, and DataLoader worker processes, which import it by that name, find it. A
    name already taken by another module gets a private one instead (such classes then do not pickle)."""
    name, private = path.stem, f"parsl_bft_user_{abs(hash(str(path)))}"
    for candidate in (name, private):
        where = getattr(sys.modules.get(candidate), "__file__", None)
        if where and Path(where).resolve() == path:
            return sys.modules[candidate]
    if name in sys.modules or name in sys.stdlib_module_names or not name.isidentifier():
        name = private
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no such file: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def workload_factory(spec: str) -> Callable[..., Workload]:
    """'images' | 'lm' | 'emulated' | 'package.module:factory' | '/path/to/file.py:factory': the class or function that
    returns the Workload (loading it is the check that the spec names one)."""
    if spec in WORKLOADS:
        builtin = WORKLOADS[spec]
        return cast(Callable[..., Workload], load_attr(builtin) if isinstance(builtin, str) else builtin)
    if ":" not in spec:
        raise WorkloadError(f"unknown workload {spec!r}: use {', '.join(WORKLOADS)}, 'package.module:factory' "
                            "or '/path/to/file.py:factory'")
    return cast(Callable[..., Workload], load_attr(spec))    # the user's factory, taken at its word


def make_workload(spec: str, **kwargs: Any) -> Workload:
    """The Workload ``spec`` names (``workload_factory``), built with ``kwargs``."""
    return workload_factory(spec)(**kwargs)
