"""The random generators' states (torch CPU and CUDA, numpy, Python) as a checkpoint stores them."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Every generator's state, in the form ``TrainingState.rng`` stores (arrays, not long lists of ints)."""
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": _np_state(np.random.get_state()),
          "python": _py_state(random.getstate())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        st["cuda"] = list(torch.cuda.get_rng_state_all())
    return st


def restore_rng(st: dict[str, Any]) -> None:
    """Set every generator back to a state ``capture_rng`` took (CUDA's only where CUDA is available)."""
    torch.set_rng_state(st["torch"])
    np.random.set_state(tuple(st["numpy"]))
    random.setstate((st["python"][0], tuple(int(x) for x in st["python"][1]), st["python"][2]))   # older files: a list
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _np_state(s: Any) -> list[Any]:
    return [s[0], np.asarray(s[1]), int(s[2]), int(s[3]), float(s[4])]


def _py_state(s: Any) -> list[Any]:
    # one array, not 625 ints: each int was an HDF5 attribute (~0.03 s of CPU a save, ~0.04 s a restore)
    return [s[0], np.asarray(s[1], dtype=np.uint32), s[2]]
