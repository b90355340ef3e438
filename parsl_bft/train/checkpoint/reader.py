"""Reading a checkpoint: every file is untrusted input (checkpoints are staged between sites), verified before
any of it reaches the live model. A damaged file is reported by dataset name (CheckpointError)."""
from __future__ import annotations

import json
import math
import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import xxhash

from .format import (
    BY_NAME,
    FORMAT,
    NUMERIC_KINDS,
    NUMPY_UNSUPPORTED,
    PARTS,
    ROOT_ATTRS,
    VERSION,
    CheckpointError,
    MetaChecksum,
    TrainingState,
    as_count,
    digest,
)
from .staging import DeviceStaging

_PIECE = 1 << 18             # data is read and hashed in pieces this large: each hashed while still in the core's
                             # L2 cache (half the hash's cost with 4 MiB pieces, measured)
_MAPPED_MIN = 1 << 20        # datasets this large are loaded into a memory mapping of their own (see _empty)
_ON_DEVICE = ("model", "optimizer")     # the parts ``device`` applies to (RNG states stay in host memory)


@dataclass
class _Pending:
    """One dataset's data, read once the whole file's metadata has verified."""

    name: str
    offset: int | None           # None: compact or empty, already read (``got``) through HDF5
    array: np.ndarray | None     # None: read onto a device (``tensor``)
    digest: Any                  # the stored checksum (whatever the attribute holds)
    got: str | None = None
    live: bool = False           # ``array`` is a live tensor's memory (``load_checkpoint(into=...)``)
    key: Any = None              # its key in ``into``
    tensor: torch.Tensor | None = None    # a fresh tensor on an accelerator, read through DeviceStaging


class _Reader:
    """Reads one untrusted file (checkpoints are staged between sites: they are input). Hard links only; only
    numeric datasets stored contiguously (or compactly) inside the file itself - no external links, external raw
    storage, virtual layouts or filters; every declared size, and where the data ends, is bounded by the file's
    own size before anything is allocated. ``where`` names the part being read, for the error.

    Two passes: the tree (attributes, names, shapes: the metadata checksum) registers each dataset's data, and
    ``fill`` reads it once all that has verified - into fresh memory first, into the live tensors (``into``)
    last, so a file whose metadata, optimizer state or length is damaged never touches the live model."""

    def __init__(self, path: str, f: h5py.File, size: int, arrays: bool = True, fd: int | None = None,
                 device: torch.device | None = None) -> None:
        self.path, self.f, self.size, self.arrays, self.fd = path, f, size, arrays, fd
        self.device = device             # large model and optimizer tensors go there (None: CPU memory)
        self.where: str | None = None
        self.read: list[str] = []
        self.meta = MetaChecksum()
        self.pending: list[_Pending] = []
        self.written: list[Any] = []   # keys of the live tensors written so far
        self.declared = 0                # bytes every dataset so far declares: all of them lie in the file

    def fail(self, problem: str) -> CheckpointError:
        """The error for ``problem`` at the part being read (and the live tensors written so far)."""
        return CheckpointError(self.path, problem, self.where, written=self.written)

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

    def attr(self, obj: Any, name: str, default: Any = KeyError) -> Any:
        """An attribute of ``obj``, its size bounded first; ``default`` when absent (missing: an error)."""
        if name not in obj.attrs:
            if default is KeyError:
                raise self.fail(f"missing attribute {name!r}")
            return default
        aid = h5py.h5a.open(obj.id, name.encode())
        declared = math.prod(aid.shape or ()) * aid.dtype.itemsize
        if declared > self.size:
            raise self.fail(f"attribute {name!r} declares {declared:,} bytes, more than the whole file")
        v = obj.attrs[name]
        self.meta.add(obj.name, name, v)
        return v

    def text(self, obj: Any, name: str) -> str:
        """A text attribute."""
        v = self.attr(obj, name)
        if not isinstance(v, str):
            raise self.fail(f"attribute {name!r} is not text")
        return v

    def json(self, obj: Any, name: str) -> Any:
        """A JSON attribute, decoded."""
        return json.loads(self.text(obj, name))

    def child(self, g: h5py.Group, name: str) -> Any:
        """A member of ``g`` reached through a hard link (no external or soft links)."""
        self.where = f"{g.name.rstrip('/')}/{name}"
        link = g.get(name, getlink=True)
        if link is None:
            raise self.fail("missing entry")
        if not isinstance(link, h5py.HardLink):
            raise self.fail(f"{type(link).__name__} not allowed in a checkpoint (only hard links)")
        return g[name]

    def tree(self, g: h5py.Group, into: Mapping[str, torch.Tensor] | None = None) -> Any:
        """A dict, list or tuple group, its members read by ``item``."""
        kind = self.attr(g, "__kind__", None)
        if kind == "dict":
            keys = self.json(g, "__keys__")
            if not isinstance(keys, list):
                raise self.fail("damaged key list")
            keys = [int(k) if t == "int" else k for t, k in keys]
            return {k: self.item(g, f"k{i}", into.get(k) if into is not None else None, k) for i, k in enumerate(keys)}
        if kind in ("list", "tuple"):
            n = int(self.attr(g, "__len__"))
            if n < 0 or n > self.size:
                raise self.fail(f"damaged length {n}")
            items = [self.item(g, f"i{i}") for i in range(n)]
            return items if kind == "list" else tuple(items)
        self.where = g.name
        raise self.fail(f"unknown group kind {kind!r}")

    def item(self, g: h5py.Group, name: str, target: Any = None, key: Any = None) -> Any:
        """One member: a JSON attribute, a group or a dataset."""
        if f"json:{name}" in g.attrs:
            return self.json(g, f"json:{name}")
        obj = self.child(g, name)
        if isinstance(obj, h5py.Group):
            self.meta.add(g.name, name, "group")
            return self.tree(obj)
        if not isinstance(obj, h5py.Dataset):
            raise self.fail(f"unexpected object {type(obj).__name__}")
        return self.array(obj, target, key)

    def array(self, ds: h5py.Dataset, target: Any = None, key: Any = None) -> Any:
        """A dataset's tensor (or array), checked and registered; its data is read by ``fill``."""
        self.where = ds.name
        dcpl = ds.id.get_create_plist()
        if dcpl.get_layout() not in (h5py.h5d.CONTIGUOUS, h5py.h5d.COMPACT):
            raise self.fail("only contiguous datasets are allowed (chunked or virtual layout)")
        if dcpl.get_external_count():
            raise self.fail("external raw storage is not allowed")
        if dcpl.get_nfilters():
            raise self.fail("filters are not allowed")
        dt = ds.dtype
        if dt.kind not in NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None or dt.itemsize > 16:
            raise self.fail(f"dataset type {dt} is not allowed")
        if ds.shape is None:
            raise self.fail("dataset without a shape")
        declared = math.prod(ds.shape) * dt.itemsize
        if declared > self.size:
            raise self.fail(f"declares {declared:,} bytes, more than the whole file ({self.size:,} bytes)")
        self.declared += declared        # one by one, 300 datasets of 140 KB each in a 157 KB file loaded as 42 MB
        if self.declared > self.size:
            raise self.fail(f"the datasets declare {self.declared:,} bytes in total, more than the whole file "
                            f"({self.size:,} bytes)")
        self.meta.add(ds.name, "dataset", dt.str, tuple(ds.shape))
        numpy = self.attr(ds, "numpy", None) if "numpy" in ds.attrs else None
        dtn = self.attr(ds, "torch_dtype", "") if "torch_dtype" in ds.attrs else ""
        stored = self.attr(ds, "xxh3", None)
        self.read.append(ds.name)
        offset = ds.id.get_offset() if declared and self.fd is not None else None
        if offset is not None and offset + declared > self.size:
            raise self.fail("data past the end of the file")
        if not self.arrays:
            return None
        live = _live_view(target, ds.shape, dt, dtn) if offset is not None and numpy is None else None
        device = _device_for(target, self.device if (ds.name or "/").split("/")[1] in _ON_DEVICE else None)
        if live is None and offset is not None and numpy is None and device is not None \
                and declared >= _MAPPED_MIN and dt.kind in "biuf":
            t = torch.empty(ds.shape, dtype=BY_NAME.get(dtn) or torch.from_numpy(np.empty(0, dt)).dtype,
                            device=device)
            self.pending.append(_Pending(ds.name, offset, None, stored, tensor=t))
            return t
        a = _empty(ds.shape, dt) if live is None else live
        got = None
        if offset is None:                       # compact (HDF5 places it itself) or empty: small, read now
            if a.size:
                ds.read_direct(a)
            got = digest(a)
        self.pending.append(_Pending(ds.name, offset, a, stored, got, live is not None, key))
        if live is not None:
            return target
        if numpy is not None:
            return a
        t = torch.from_numpy(a)
        if dtn in BY_NAME:
            t = t.view(BY_NAME[dtn])
        return t


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




def load_checkpoint(path: str | Path, *, arrays: bool = True, into: Mapping[str, torch.Tensor] | None = None,
                    device: str | torch.device | None = None) -> TrainingState:
    """Read and verify one checkpoint. Whatever is wrong with the file - not there, not a regular file, not
    HDF5, damaged anywhere (HDF5's own errors included), crafted to read other files or to exhaust memory, from a
    newer format - raises CheckpointError naming the file and, when known, the dataset.

    ``arrays=False`` reads where the job stands and nothing more: attributes, names, dtypes and shapes, checked
    against the metadata checksum; every tensor is None and its data is neither read nor verified (kilobytes
    instead of gigabytes: what the orchestrator needs; the fragment that resumes reads and verifies all).

    ``into``: the live model's ``state_dict()``. Each model tensor whose name, shape and dtype match one of it
    (in CPU memory) is read straight into that tensor, and ``state.model`` holds that very tensor: a restore
    then neither sets up fresh pages for the model nor copies it again (``load_state_dict`` skips a copy onto
    itself). The rest loads as without ``into``, so a mismatch is named by ``load_state_dict`` as usual. Live
    tensors are written last, once the metadata, the file's length and every other dataset have verified; only
    damage inside the model's own data is found after they were written: the error then says ``overwritten``
    (the tensors hold part of this file; ``written`` names them) and the model must be loaded from another
    checkpoint or built again. A format-1 file (no metadata checksum) loads as without ``into``. A tensor of ``into`` on
    an accelerator is never written: its dataset is read onto that device, into a fresh tensor.

    ``device`` (an accelerator, e.g. a rank's ``cuda:0``): the model's and optimizer's tensors of 1 MiB or more
    are read onto it, as ``torch.load(map_location=)`` would place them, through pinned staging buffers (no
    fresh host memory, no pageable copy); smaller ones (an optimizer's step counts) stay in CPU memory."""
    p = str(path)
    r = _open(p, arrays, torch.device(device) if device is not None else None)
    try:
        with r.f:
            return _read_state(r, into)
    except CheckpointError:
        raise
    except Exception as e:  # RuntimeError (HDF5), MemoryError, RecursionError (deep JSON), ...
        raise CheckpointError(p, f"damaged structure ({type(e).__name__}: {str(e)[:200]})", r.where,
                              written=r.written) from None


def _open(p: str, arrays: bool, device: torch.device | None = None) -> _Reader:
    """A reader of the regular file ``p``, opened by HDF5 (which must recognise it)."""
    try:
        st = os.stat(p)
    except OSError as e:
        raise CheckpointError(p, f"cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(p, "not a regular file")
    try:
        f = h5py.File(p, "r")
    except Exception as e:  # h5py raises OSError, ValueError, RuntimeError ... on damaged files
        raise CheckpointError(p, f"not a readable HDF5 file ({type(e).__name__}: {e})") from None
    # HDF5's own descriptor, and that file's size: a save may have replaced the file at this path since the stat
    fd = f.id.get_vfd_handle()
    return _Reader(p, f, os.fstat(fd).st_size if fd is not None else st.st_size, arrays, fd, device)


def _read_state(r: _Reader, into: Mapping[str, torch.Tensor] | None) -> TrainingState:
    """The whole file, in the order the metadata checksum was computed; the data last (``fill``)."""
    p, f = r.path, r.f
    if r.attr(f, "format", None) != FORMAT:
        raise CheckpointError(p, "not a parsl-bft checkpoint")
    version = int(r.attr(f, "version", 0))
    if version > VERSION:
        raise CheckpointError(p, f"written by a newer parsl-bft (format version {version})")
    root = {k: r.attr(f, k) for k in ROOT_ATTRS[2:]}
    parts = _read_parts(r, version, into)
    manifest = r.json(f, "manifest")
    if version >= 2 and r.meta.hexdigest() != r.attr(f, "meta_xxh3", None):
        raise CheckpointError(p, "metadata checksum mismatch: attributes, names or shapes are damaged")
    if not isinstance(manifest, list):
        raise CheckpointError(p, "damaged manifest")
    missing = sorted(set(map(str, manifest)) - set(r.read))
    if missing:
        raise CheckpointError(p, "missing dataset", missing[0])
    state = TrainingState(model=parts["model"] or {}, optimizer=parts["optimizer"],
                          scheduler=parts["scheduler"], rng=parts["rng"], step=as_count(root["step"]),
                          epoch=as_count(root["epoch"]), samples_done=as_count(root["samples_done"]),
                          data_position=as_count(root["data_position"]), job=json.loads(root["job"]),
                          metrics=json.loads(root["metrics"]), extra=json.loads(root["extra"]))
    if not isinstance(state.model, dict) or not isinstance(state.job, dict) \
            or not isinstance(state.metrics, list) or not isinstance(state.extra, dict):
        raise CheckpointError(p, "damaged structure: unexpected types")
    r.fill()
    return state


def _read_parts(r: _Reader, version: int, into: Mapping[str, torch.Tensor] | None) -> dict[str, Any]:
    """The model, optimizer, scheduler and rng trees (None where absent); arrays registered, not yet read."""
    f = r.f
    parts: dict[str, Any] = {}
    for key in PARTS:
        if f.get(key, getlink=True) is None:
            r.meta.add("/", key, "absent")
            parts[key] = None
        else:
            g = r.child(f, key)
            r.meta.add("/", key, "group")
            if not isinstance(g, h5py.Group):
                raise r.fail("not a group")
            # format 1 has no metadata checksum to pass before live tensors are written: fresh memory
            parts[key] = r.tree(g, into if key == "model" and version >= 2 else None)
    r.where = None
    return parts
