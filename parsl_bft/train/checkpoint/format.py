"""The checkpoint file format: its constants, what a checkpoint holds (TrainingState), its errors, the metadata
checksum both the writer and the reader compute, and the header of format 3.

Layout of ``ckpt-<step>.h5`` (format 3: an HDF5 file behind a user block that holds the header)::

    user block        the header (below) and the metadata record: the whole tree, each dataset's name, dtype,
                      shape, checksum and offset, one JSON document (``record``), covered by the header's checksum
    /                 attrs: format, version, step, epoch, samples_done, data_position, created,
                             job (JSON), metrics (JSON), extra (JSON), manifest (JSON list of datasets)
    /model/<name>     one dataset per tensor of the state dict
    /optimizer/...    the optimizer state dict as a tree of groups (dicts, lists) and datasets
    /scheduler/...    LR scheduler state, same encoding
    /rng/...          torch (CPU and CUDA) generator states, numpy's and Python's

Tensors keep their dtype; those numpy cannot hold (bfloat16, float8) are stored as same-width integers with
the real dtype in the ``torch_dtype`` attribute. Scalars, strings and None live in JSON attributes. Every
dataset carries an xxh3-64 checksum of its bytes, verified on load.

The HDF5 tree is the whole checkpoint (formats 1 and 2 are that alone, and h5ls/h5dump read it); the record of
format 3 says the same in one piece, so a restore reads it with a few reads instead of an HDF5 call per
attribute (~130 us each). The record also holds a checksum of every byte of the HDF5 part that is not array
data: when that matches, the tree is exactly as written and the record stands for it; when it does not (the
file was damaged or edited), the tree is read and verified the long way, as format 2 is, which names the damage.

The header (64 bytes at offset 0, little-endian) and the rule every later format keeps, so that this code
tells a newer file (refused, kept: ``NewerFormatError``) from a damaged one (set aside)::

    0  16 bytes  MAGIC
    16 u32       format version
    20 u64       xxh3-64 of bytes 0-19 (the stamp: a valid one with a version above VERSION is a newer file)
    --- format 3 from here on ---
    28 u64       user block size (where the HDF5 file starts)
    36 u64       record length (the record follows the header)
    44 u64       xxh3-64 of bytes 28-43 and the record
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import xxhash

from ...errors import ParslBftError

FORMAT = "parsl-bft-checkpoint"
VERSION = 3                  # 2: a checksum over the metadata too (attributes, dtypes, shapes); 3: the header
                             # and the metadata record in the user block
MAGIC = b"PARSL-BFT-CKPT\r\n"   # 16 bytes; \r\n: a file mangled by a text-mode copy does not match
HEADER = 64
_STAMP = struct.Struct("<16sIQ")
_LAYOUT = struct.Struct("<QQQ")
NUMERIC_KINDS = "biufc"      # the only dataset types a checkpoint holds
ROOT_ATTRS = ("format", "version", "step", "epoch", "samples_done", "data_position", "created", "job", "metrics",
              "extra")
PARTS = ("model", "optimizer", "scheduler", "rng")

NUMPY_UNSUPPORTED: dict[torch.dtype, torch.dtype] = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        NUMPY_UNSUPPORTED[getattr(torch, _name)] = torch.int8
BY_NAME = {str(d).removeprefix("torch."): d for d in NUMPY_UNSUPPORTED}


class CheckpointError(ParslBftError):
    """A checkpoint file that cannot be used; ``dataset`` names the damaged part when known. ``overwritten``: a
    load ``into`` live tensors had begun writing them when the damage showed (they hold part of this file);
    ``written`` names them (their keys in ``into``)."""

    def __init__(self, path: str, problem: str, dataset: str | None = None, *,
                 written: Sequence[Any] = ()) -> None:
        self.path, self.problem, self.dataset, self.written = path, problem, dataset, tuple(written)
        where = f" (dataset {dataset})" if dataset else ""
        super().__init__(f"{path}: {problem}{where}")

    @property
    def overwritten(self) -> bool:
        """Whether live tensors already hold part of this damaged file."""
        return bool(self.written)


class NewerFormatError(CheckpointError):
    """A checkpoint written by a newer parsl-bft (its header's stamp verifies, its version is above VERSION):
    not damaged, only unreadable here. Kept where it is (never set aside), and no older checkpoint is taken in
    its place: that would silently throw away the progress it holds."""

    def __init__(self, path: str, version: int) -> None:
        self.version = version
        super().__init__(path, f"written by a newer parsl-bft (checkpoint format {version}; this one reads up to "
                         f"{VERSION}): upgrade parsl-bft to resume from it (the file is kept)")


@dataclass
class TrainingState:
    """Everything a fragment needs to continue exactly where the last one stopped."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    step: int = 0
    epoch: int = 0
    samples_done: int = 0
    data_position: int = 0
    job: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def finite_weights(model: dict[str, Any], prefix: str = "") -> str | None:
    """The name of the first floating-point tensor holding NaN or infinity, None when all are finite; nested
    dicts are searched too (a scientist's state keeps its model under any key: {"net": ..., "ema": ...})."""
    for k, t in model.items():
        if isinstance(t, dict):
            bad = finite_weights(t, f"{prefix}{k}.")
            if bad is not None:
                return bad
        elif isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            return f"{prefix}{k}"
    return None


def digest(a: np.ndarray) -> str:
    """The xxh3-64 checksum of an array's bytes, as stored in a dataset's ``xxh3`` attribute."""
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)


def plain(v: Any) -> Any:
    """An attribute value as Python sees it, the same whether just written or read back."""
    return v.item() if isinstance(v, np.generic) else v


def as_count(v: Any) -> int:
    """A root attribute that must be a non-negative int (step, epoch, ...); ValueError otherwise."""
    v = plain(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"not a count: {v!r}")
    return v


class MetaChecksum:
    """The metadata checksum (format 2): every attribute, dataset name, dtype and shape, fed in the order the
    tree is written and read, so that a damaged JSON attribute or a changed dtype is caught like damaged data."""

    def __init__(self) -> None:
        self.h = xxhash.xxh3_64()

    def add(self, *parts: Any) -> None:
        """Feed one record (an attribute, a dataset's header, a group's presence)."""
        self.h.update(repr(tuple(plain(p) for p in parts)).encode())
        self.h.update(b"\0")

    def hexdigest(self) -> str:
        """The checksum of everything fed so far."""
        return self.h.hexdigest()


def pack_header(version: int, userblock: int, record: bytes) -> bytes:
    """The header of a file whose record is ``record`` (``version``: VERSION, other values only in tests)."""
    head = _STAMP.pack(MAGIC, version, 0)[:20]
    head += struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
    tail = struct.pack("<QQ", userblock, len(record))
    tail += struct.pack("<Q", xxhash.xxh3_64_intdigest(tail + record))
    return (head + tail).ljust(HEADER, b"\0")


def stamped_version(header: bytes) -> int | None:
    """The version of a file whose first bytes are ``header``, None when it has no header or a damaged one
    (every format from 3 on has one)."""
    if len(header) < HEADER:
        return None
    magic, version, stamp = _STAMP.unpack_from(header)
    if magic != MAGIC or stamp != xxhash.xxh3_64_intdigest(header[:20]):
        return None
    return int(version)


def record_place(header: bytes) -> tuple[int, int, int]:
    """(user block size, record length, record checksum) from a format-3 header."""
    return _LAYOUT.unpack_from(header, 28)


def record_digest(header: bytes, record: bytes) -> int:
    """The checksum a format-3 header stores for ``record``."""
    return xxhash.xxh3_64_intdigest(header[28:44] + record)
