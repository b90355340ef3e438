"""Format 3's metadata record: the whole checkpoint but the array bytes, in one JSON document kept in the HDF5
user block (see ``format``), so that a restore reads it in a few reads instead of one HDF5 call per attribute.

The record (a JSON object)::

    root     the root attributes' values: step, epoch, samples_done, data_position, created, and job, extra
             as their JSON text (as the attributes hold them); not metrics, the history that grows with every
             step: a restore reads that one attribute (the layout checksum covers it)
    parts    {"model": NODE or null, "optimizer": ..., "scheduler": ..., "rng": ...}
    data     one entry per dataset, in the order written: [name, numpy dtype, shape, torch dtype or null,
             numpy array (true/false), xxh3 of its bytes, file offset or null (no bytes)]
    layout   [user block size, file size, xxh3 of every byte of the HDF5 part outside the datasets' data]

    NODE     ["dict", [[key type, key, ITEM], ...]] | ["list", [ITEM, ...]] | ["tuple", [ITEM, ...]]
    ITEM     NODE | ["array", index into data] | ["json", value]

Dataset names are the HDF5 paths the writer gives them (``/model/k0``): errors name the same dataset whichever
way the file is read.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import xxhash

from .format import BY_NAME, HEADER, NUMERIC_KINDS, NUMPY_UNSUPPORTED, PARTS, digest

_SPAN = 1 << 24              # the layout checksum reads at most this much at a time


@dataclass
class Array:
    """One dataset to write: its HDF5 path, its bytes as numpy sees them, its attributes and checksum, and
    (once the layout is written) where its bytes are."""

    name: str
    array: np.ndarray
    attrs: dict[str, Any]
    digest: str
    offset: int | None = None


@dataclass
class Encoded:
    """A TrainingState's parts as record nodes, and the arrays they refer to (by index)."""

    parts: dict[str, Any] = field(default_factory=dict)
    arrays: list[Array] = field(default_factory=list)

    def record(self, root: dict[str, Any], layout: list[Any]) -> bytes:
        """The record as written into the user block."""
        data = [[a.name, a.array.dtype.str, list(a.array.shape), a.attrs.get("torch_dtype"), "numpy" in a.attrs,
                 a.digest, a.offset] for a in self.arrays]
        doc = {"root": root, "parts": self.parts, "data": data, "layout": layout}
        return json.dumps(doc, separators=(",", ":")).encode()

    def userblock(self, root: dict[str, Any]) -> int:
        """A user block large enough for the header and the final record (offsets and the layout are not known
        yet: each offset takes at most 20 characters more than null, the layout at most 60 more)."""
        n = HEADER + len(self.record(root, [0, 0, "0" * 16])) + 20 * len(self.arrays) + 60
        return max(512, 1 << (n - 1).bit_length())

    def ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of every dataset's bytes in the file."""
        return [(a.offset, a.array.nbytes) for a in self.arrays if a.offset is not None]


def encode(obj: Any, path: str, enc: Encoded) -> list[Any]:
    """The record node of a dict, list or tuple at HDF5 path ``path``; its arrays are appended to ``enc``."""
    if isinstance(obj, dict):
        return ["dict", [[type(k).__name__, k, _item(v, f"{path}/k{i}", enc)] for i, (k, v) in enumerate(obj.items())]]
    if isinstance(obj, (list, tuple)):
        return [type(obj).__name__, [_item(v, f"{path}/i{i}", enc) for i, v in enumerate(obj)]]
    raise TypeError(f"cannot store {type(obj).__name__} as a tree")


def _item(v: Any, path: str, enc: Encoded) -> list[Any]:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        attrs: dict[str, Any] = {"torch_dtype": str(t.dtype).removeprefix("torch.")}
        if t.dtype in NUMPY_UNSUPPORTED:
            t = t.view(NUMPY_UNSUPPORTED[t.dtype])
        return _array(t.numpy(), path, attrs, enc)
    if isinstance(v, np.ndarray):
        return _array(np.ascontiguousarray(v), path, {"numpy": 1}, enc)
    if isinstance(v, (dict, list, tuple)):
        return encode(v, path, enc)
    if v is None or isinstance(v, (bool, int, float, str)):
        return ["json", v]
    if isinstance(v, (np.integer, np.floating)):
        return ["json", v.item()]
    raise TypeError(f"cannot store {type(v).__name__} in a checkpoint (at {path})")


def _array(a: np.ndarray, path: str, attrs: dict[str, Any], enc: Encoded) -> list[Any]:
    if a.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"cannot store a {a.dtype} array in a checkpoint (at {path})")
    enc.arrays.append(Array(path, a, attrs, digest(a)))
    return ["array", len(enc.arrays) - 1]


def layout_digest(fd: int, userblock: int, size: int, ranges: list[tuple[int, int]]) -> str:
    """The xxh3-64 of every byte from ``userblock`` to ``size`` outside ``ranges`` (the datasets' data: they
    have checksums of their own). ``ranges`` lie inside that span and do not overlap. ValueError when the file
    ends early."""
    h, pos = xxhash.xxh3_64(), userblock
    for offset, n in sorted(ranges):
        _hash_span(fd, pos, offset, h)
        pos = offset + n
    _hash_span(fd, pos, size, h)
    return h.hexdigest()


def _hash_span(fd: int, start: int, end: int, h: Any) -> None:
    while start < end:
        b = os.pread(fd, min(end - start, _SPAN), start)
        if not b:
            raise ValueError("the file ends early")
        h.update(b)
        start += len(b)


@dataclass
class Entry:
    """A dataset as the record declares it, checked."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    torch_dtype: str
    numpy: bool
    digest: str
    offset: int | None
    nbytes: int


@dataclass
class Record:
    """A parsed, checked record: the root values, the part nodes, the datasets, the layout checksum."""

    root: dict[str, Any]
    parts: dict[str, Any]
    data: list[Entry]
    size: int
    layout: str

    def ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of every dataset's bytes."""
        return [(e.offset, e.nbytes) for e in self.data if e.offset is not None]


def parse(raw: bytes, size: int, userblock: int) -> Record:
    """The record ``raw`` of a file of ``size`` bytes whose HDF5 part starts at ``userblock``. ValueError naming
    what is wrong; the declared sizes are checked, in total too, before anything is allocated: each dataset's
    bytes inside the HDF5 part, none overlapping another's."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or set(doc) != {"root", "parts", "data", "layout"}:
        raise ValueError("not a record")
    root, parts, data, layout = doc["root"], doc["parts"], doc["data"], doc["layout"]
    if not isinstance(root, dict) or not isinstance(parts, dict) or set(parts) != set(PARTS) \
            or not isinstance(data, list) or not isinstance(layout, list) or len(layout) != 3:
        raise ValueError("unexpected shape")
    if layout[0] != userblock or not isinstance(layout[1], int) or not isinstance(layout[2], str):
        raise ValueError("its layout does not match the header")
    entries = [_entry(e) for e in data]
    declared = sum(e.nbytes for e in entries)
    if declared > size:
        raise ValueError(f"its datasets declare {declared:,} bytes together, more than the whole file "
                         f"({size:,} bytes)")
    end = userblock
    for e in sorted((e for e in entries if e.offset is not None), key=lambda e: e.offset or 0):
        assert e.offset is not None
        if e.offset < end or e.offset + e.nbytes > size:
            raise ValueError(f"the data of {e.name} overlaps other data or lies outside the file")
        end = e.offset + e.nbytes
    return Record(root, parts, entries, layout[1], layout[2])


def _entry(e: Any) -> Entry:
    """One dataset's entry, checked as the long way checks an HDF5 dataset (numeric, at most 16 bytes an item,
    no structured or sub-array types)."""
    if not isinstance(e, list) or len(e) != 7:
        raise ValueError("damaged dataset entry")
    name, dts, shape, dtn, numpy, xxh3, offset = e
    if not isinstance(name, str) or not isinstance(dts, str) or not isinstance(shape, list) or len(shape) > 32 \
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape) \
            or not isinstance(numpy, bool) or not isinstance(xxh3, str) or not (dtn is None or isinstance(dtn, str)):
        raise ValueError(f"damaged dataset entry {str(name)[:100]!r}")
    dt = np.dtype(dts)
    if dt.kind not in NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None or dt.itemsize > 16:
        raise ValueError(f"dataset type {dt} is not allowed ({name})")
    if dtn in BY_NAME and torch.empty(0, dtype=BY_NAME[dtn]).element_size() != dt.itemsize:
        raise ValueError(f"{name} is stored as {dt}, which cannot hold {dtn}")
    nbytes = math.prod(shape) * dt.itemsize
    if (offset is None) != (nbytes == 0) or not (offset is None or isinstance(offset, int)):
        raise ValueError(f"{name}: its bytes have no place in the file")
    return Entry(name, dt, tuple(shape), dtn or "", numpy, xxh3, offset, nbytes)
