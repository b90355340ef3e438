"""The memory side of reading a checkpoint, whichever way its tree is read (the HDF5 tree, or format 3's
record): each dataset registered with its declared size counted against the file's, memory allocated once all
are known, the data read and verified into it - into the live tensors (``into``) last."""
from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from .format import BY_NAME, NUMPY_UNSUPPORTED, CheckpointError, digest
from .staging import DeviceStaging

_PIECE = 1 << 18             # data is read and hashed in pieces this large: each hashed while still in the core's
                             # L2 cache (half the hash's cost with 4 MiB pieces, measured)
_MAPPED_MIN = 1 << 20        # datasets this large are loaded into a memory mapping of their own (see _empty)
_ON_DEVICE = ("model", "optimizer")     # the parts ``device`` applies to (RNG states stay in host memory)


@dataclass
class _Pending:
    """One dataset: registered while the tree is read, its memory allocated once every declared size has been
    checked (``materialize``), its data read once the whole file's metadata has verified (``fill``)."""

    name: str
    offset: int | None           # None: compact or empty, read through HDF5 (``ds``) when allocated
    shape: tuple[int, ...]
    dt: np.dtype
    dtn: str                     # the torch dtype numpy cannot hold ("" when numpy can)
    numpy: bool                  # stored from a numpy array: comes back as one
    digest: Any                  # the stored checksum (whatever the attribute holds)
    device: torch.device | None = None    # read onto this accelerator (``tensor``), through DeviceStaging
    ds: Any = None               # the HDF5 dataset of compact data
    array: np.ndarray | None = None       # the memory read into
    got: str | None = None
    live: bool = False           # ``array`` is a live tensor's memory (``load_checkpoint(into=...)``)
    key: Any = None              # its key in ``into``
    tensor: torch.Tensor | None = None    # a fresh tensor on an accelerator
    result: Any = None           # what the state holds for it


class _Slot:
    """A dataset's place in a tree being read, until its memory exists (``_resolve``)."""

    __slots__ = ("pending",)

    def __init__(self, pending: _Pending) -> None:
        self.pending = pending


class Loading:
    """One load's datasets and where it stands, for the error: ``where`` names the part being read, ``written``
    the live tensors already written. Every declared size, and where the data ends, is bounded by the file's own
    size before anything is allocated."""

    def __init__(self, path: str, size: int, arrays: bool, fd: int | None, device: torch.device | None) -> None:
        self.path, self.size, self.arrays, self.fd = path, size, arrays, fd
        self.device = device             # large model and optimizer tensors go there (None: CPU memory)
        self.where: str | None = None
        self.pending: list[_Pending] = []
        self.declared = 0                # bytes the datasets met so far declare, together
        self.written: list[Any] = []     # keys of the live tensors written so far

    def fail(self, problem: str) -> CheckpointError:
        """The error for ``problem`` at the part being read (and the live tensors written so far)."""
        return CheckpointError(self.path, problem, self.where, written=self.written)

    def register(self, name: str, shape: tuple[int, ...], dt: np.dtype, dtn: str, numpy: bool, stored: Any,
                 offset: int | None, target: Any = None, key: Any = None, ds: Any = None) -> Any:
        """One dataset of the tree, its declared size counted against the file's (the sum, not each alone: many
        entries sharing the same bytes would make a small file load as gigabytes); nothing allocated yet. What
        the tree holds for it: ``target`` when read into it, else a slot (None with ``arrays=False``)."""
        self.declared += math.prod(shape) * dt.itemsize
        if self.declared > self.size:
            raise self.fail(f"the datasets declare {self.declared:,} bytes together, more than the whole file "
                            f"({self.size:,} bytes)")
        if not self.arrays:
            return None
        live = _live_view(target, shape, dt, dtn) if offset is not None and not numpy else None
        device = None
        if live is None and offset is not None and not numpy and math.prod(shape) * dt.itemsize >= _MAPPED_MIN \
                and dt.kind in "biuf":
            device = _device_for(target, self.device if (name or "/").split("/")[1] in _ON_DEVICE else None)
        p = _Pending(name, offset, shape, dt, dtn, numpy, stored, device, ds, array=live, live=live is not None,
                     key=key)
        self.pending.append(p)
        if live is not None:
            p.result = target
            return target
        return _Slot(p)

    def materialize(self) -> None:
        """Memory for every registered dataset (compact ones read now: small, and inside the metadata)."""
        for p in self.pending:
            self.where = p.name
            if p.live:
                continue
            if p.device is not None:
                dtype = BY_NAME.get(p.dtn) or torch.from_numpy(np.empty(0, p.dt)).dtype
                p.result = p.tensor = torch.empty(p.shape, dtype=dtype, device=p.device)
                continue
            a = p.array = _empty(p.shape, p.dt)
            if p.offset is None:
                if a.size:
                    p.ds.read_direct(a)
                p.got = digest(a)
            p.result = a if p.numpy else torch.from_numpy(a)
            if p.dtn in BY_NAME:
                p.result = p.result.view(BY_NAME[p.dtn])
        self.where = None

    def fill(self) -> None:
        """Read and verify every registered dataset, live tensors last (``sorted`` is stable)."""
        staging = None
        for p in sorted(self.pending, key=lambda p: p.live):
            self.where = p.name
            if p.offset is not None:
                if p.live:
                    self.written.append(p.key)
                assert self.fd is not None       # an offset is only taken where HDF5 gave its descriptor
                if p.tensor is not None:
                    staging = staging or DeviceStaging(_PIECE)
                    p.got = staging.read(self.fd, p.offset, p.tensor)
                else:
                    assert p.array is not None
                    p.got = _read_into(self.fd, p.offset, p.array)
            if p.got is None:
                raise self.fail("data past the end of the file")
            if p.got != p.digest:
                raise self.fail("checksum mismatch: the data is damaged")
        if staging is not None:
            staging.finish()
        self.where = None


def resolve(obj: Any) -> Any:
    """A tree read with slots, each replaced by its dataset's tensor or array (``Loading.materialize`` first)."""
    if isinstance(obj, _Slot):
        return obj.pending.result
    if isinstance(obj, dict):
        return {k: resolve(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(v) for v in obj)
    return obj


def _live_view(target: Any, shape: tuple[int, ...], dt: np.dtype, dtn: str) -> np.ndarray | None:
    """The memory of ``target`` as an array to read a dataset of this shape and type into, None when it cannot
    take it as it is (another shape or dtype, not in CPU memory, not one dense block): that dataset is then
    loaded into fresh memory, and ``load_state_dict`` copies it - or names the mismatch. Plain tensors only: a
    subclass's memory need not be its values (a lazy module's uninitialised parameter has none and raises when
    asked its shape: blamed on the file, that set a good checkpoint aside as damaged)."""
    if type(target) not in (torch.Tensor, torch.nn.Parameter) or target.device.type != "cpu" \
            or target.layout != torch.strided \
            or not target.is_contiguous() or target.is_conj() or target.is_neg() \
            or tuple(target.shape) != tuple(shape) or str(target.dtype).removeprefix("torch.") != dtn:
        return None
    t = target.detach()
    a = t.view(NUMPY_UNSUPPORTED.get(t.dtype, t.dtype)).numpy()
    return a if a.dtype == dt else None


def _device_for(target: Any, device: torch.device | None) -> torch.device | None:
    """Where a large tensor is read to: the accelerator its live counterpart is on, else ``device`` (None: CPU
    memory, as before)."""
    if isinstance(target, torch.Tensor) and target.device.type not in ("cpu", "meta"):
        return target.device
    return device if device is not None and device.type != "cpu" else None


def _empty(shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """Memory for a dataset. Large ones get a private anonymous mapping of their own, its pages mapped in one call
    (MAP_POPULATE): faulting them in one by one as the read first touched them (a trap each, costly in a VM) made
    loads 10-30 % slower. Not numpy's allocator: it asks for transparent huge pages for large arrays, and their
    faults made loads slow and erratic - seconds instead of a fraction (measured again: 0.2-4.3 s for 1.2 GB)."""
    n = math.prod(shape) * dt.itemsize
    if n < _MAPPED_MIN:
        return torch.empty(n, dtype=torch.uint8).numpy().view(dt).reshape(shape)
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
    return np.frombuffer(m, dtype=dt).reshape(shape)                     # the array keeps the mapping alive


def _read_into(fd: int, offset: int, a: np.ndarray) -> str | None:
    """Read ``a.nbytes`` bytes at ``offset`` into ``a``, hashing each piece while it is in cache: the xxh3 digest,
    None when the file ends first."""
    buf, h = a.reshape(-1).view(np.uint8).data, xxhash.xxh3_64()
    for pos in range(0, len(buf), _PIECE):
        piece = buf[pos:pos + _PIECE]
        if os.preadv(fd, [piece], offset + pos) != len(piece):
            return None
        h.update(piece)
    return h.hexdigest()
