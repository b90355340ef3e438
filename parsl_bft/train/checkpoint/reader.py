"""Reading a checkpoint: every file is untrusted input (checkpoints are staged between sites), verified before
any of it reaches the live model. A damaged file is reported by dataset name (CheckpointError).

Two ways to the tree: format 3's record (``_read_indexed``: a few reads, used when the header, the record and the
checksum of the HDF5 part's metadata bytes all verify), else the HDF5 tree itself, attribute by attribute
(``_read_state``: formats 1 and 2, and a format-3 file whose record does not verify - that way names the
damage). Either way the datasets' memory and data go through ``loading.Loading``."""
from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import torch

from . import record
from .format import (
    FORMAT,
    HEADER,
    NUMERIC_KINDS,
    PARTS,
    ROOT_ATTRS,
    VERSION,
    CheckpointError,
    MetaChecksum,
    NewerFormatError,
    TrainingState,
    as_count,
    record_digest,
    record_place,
    stamped_version,
)
from .loading import Loading, resolve
from .loading import _read_into as _read_into  # the tests compare DeviceStaging's reads with it


class _Reader(Loading):
    """Reads one untrusted file (checkpoints are staged between sites: they are input). Hard links only; only
    numeric datasets stored contiguously (or compactly) inside the file itself - no external links, external raw
    storage, virtual layouts or filters; every declared size, and where the data ends, is bounded by the file's
    own size before anything is allocated. ``where`` names the part being read, for the error.

    Two passes: the tree (attributes, names, shapes: the metadata checksum) registers each dataset's data, and
    ``fill`` reads it once all that has verified - into fresh memory first, into the live tensors (``into``)
    last, so a file whose metadata, optimizer state or length is damaged never touches the live model."""

    def __init__(self, path: str, f: h5py.File, size: int, arrays: bool = True, fd: int | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__(path, size, arrays, fd, device)
        self.f = f
        self.read: list[str] = []
        self.meta = MetaChecksum()

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
        self.meta.add(ds.name, "dataset", dt.str, tuple(ds.shape))
        numpy = self.attr(ds, "numpy", None) if "numpy" in ds.attrs else None
        dtn = self.attr(ds, "torch_dtype", "") if "torch_dtype" in ds.attrs else ""
        stored = self.attr(ds, "xxh3", None)
        self.read.append(ds.name)
        offset = ds.id.get_offset() if declared and self.fd is not None else None
        if offset is not None and offset + declared > self.size:
            raise self.fail("data past the end of the file")
        return self.register(ds.name, tuple(ds.shape), dt, dtn, numpy is not None, stored, offset, target, key, ds)


def load_checkpoint(path: str | Path, *, arrays: bool = True, into: Mapping[str, torch.Tensor] | None = None,
                    device: str | torch.device | None = None) -> TrainingState:
    """Read and verify one checkpoint. Whatever is wrong with the file - not there, not a regular file, not
    HDF5, damaged anywhere (HDF5's own errors included), crafted to read other files or to exhaust memory, from a
    newer format - raises CheckpointError naming the file and, when known, the dataset; a file of a newer format
    whose header verifies raises its subclass NewerFormatError (not damaged: the store keeps it).

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
    checkpoint or built again. A format-1 file (no metadata checksum) loads as without ``into``. A tensor of
    ``into`` on an accelerator is never written: its dataset is read onto that device, into a fresh tensor.

    ``device`` (an accelerator, e.g. a rank's ``cuda:0``): the model's and optimizer's tensors of 1 MiB or more
    are read onto it, as ``torch.load(map_location=)`` would place them, through pinned staging buffers (no
    fresh host memory, no pageable copy); smaller ones (an optimizer's step counts) stay in CPU memory."""
    p = str(path)
    r = _open(p, arrays, torch.device(device) if device is not None else None)
    try:
        with r.f:
            st = _read_indexed(r, into)
            return st if st is not None else _read_state(r, into)
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
    _refuse_newer(p)
    try:
        f = h5py.File(p, "r")
    except Exception as e:  # h5py raises OSError, ValueError, RuntimeError ... on damaged files
        raise CheckpointError(p, f"not a readable HDF5 file ({type(e).__name__}: {e})") from None
    # HDF5's own descriptor, and that file's size: a save may have replaced the file at this path since the stat
    fd = f.id.get_vfd_handle()
    return _Reader(p, f, os.fstat(fd).st_size if fd is not None else st.st_size, arrays, fd, device)


def _refuse_newer(p: str) -> None:
    """NewerFormatError when ``p`` starts with a newer format's header: known by the header alone, before HDF5
    is asked (a later format need not be HDF5 at all)."""
    try:
        with open(p, "rb") as fh:
            version = stamped_version(fh.read(HEADER))
    except OSError as e:
        raise CheckpointError(p, f"cannot read: {e.strerror or e}") from None
    if version is not None and version > VERSION:
        raise NewerFormatError(p, version)


def _read_state(r: _Reader, into: Mapping[str, torch.Tensor] | None) -> TrainingState:
    """The whole file, in the order the metadata checksum was computed; the data last (``fill``)."""
    p, f = r.path, r.f
    if r.attr(f, "format", None) != FORMAT:
        raise CheckpointError(p, "not a parsl-bft checkpoint")
    version = int(r.attr(f, "version", 0))
    if version > VERSION:           # a newer format's file has a header whose stamp verifies (_read_indexed)
        raise CheckpointError(p, f"damaged: its version attribute says format {version} (a newer parsl-bft's) "
                              "but it has no valid header of that format")
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
    return _finish(r, root, parts)


def _finish(r: Loading, root: dict[str, Any], parts: dict[str, Any]) -> TrainingState:
    """The state of a tree read (its datasets registered): checked, its memory allocated, its data read."""
    state = TrainingState(model=parts["model"] or {}, optimizer=parts["optimizer"],
                          scheduler=parts["scheduler"], rng=parts["rng"], step=as_count(root["step"]),
                          epoch=as_count(root["epoch"]), samples_done=as_count(root["samples_done"]),
                          data_position=as_count(root["data_position"]), job=json.loads(root["job"]),
                          metrics=json.loads(root["metrics"]), extra=json.loads(root["extra"]))
    if not isinstance(state.model, dict) or not isinstance(state.job, dict) \
            or not isinstance(state.metrics, list) or not isinstance(state.extra, dict):
        raise CheckpointError(r.path, "damaged structure: unexpected types")
    r.materialize()
    r.fill()
    for key in PARTS:
        setattr(state, key, resolve(getattr(state, key)))
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


def _read_indexed(r: _Reader, into: Mapping[str, torch.Tensor] | None) -> TrainingState | None:
    """A format-3 file read through its record; None when it cannot be (no header, or the record or the HDF5
    part's metadata does not verify: read the long way). A newer format's header: NewerFormatError."""
    if r.fd is None:
        return None
    header = os.pread(r.fd, HEADER, 0)
    version = stamped_version(header)
    if version is not None and version > VERSION:
        raise NewerFormatError(r.path, version)
    if version != VERSION:
        return None
    userblock, length, stored = record_place(header)
    if not HEADER + length <= userblock <= r.size:
        return None
    raw = os.pread(r.fd, length, HEADER)
    if record_digest(header, raw) != stored:
        return None
    try:
        rec = record.parse(raw, r.size, userblock)
    except (ValueError, TypeError, RecursionError) as e:    # it verified: written so, not damaged on the way
        raise r.fail(f"damaged metadata record: {e}") from None
    if rec.size != r.size or record.layout_digest(r.fd, userblock, r.size, rec.ranges()) != rec.layout:
        return None                                          # the HDF5 part changed since it was written
    used: set[int] = set()
    parts = {k: None if rec.parts[k] is None else _node(r, rec, rec.parts[k], used, into if k == "model" else None)
             for k in PARTS}
    if len(used) != len(rec.data):
        raise r.fail("damaged metadata record: a dataset belongs to no tree")
    return _finish(r, {**rec.root, "metrics": r.text(r.f, "metrics")}, parts)     # (not in the record)


def _node(r: _Reader, rec: record.Record, node: Any, used: set[int], into: Mapping[Any, torch.Tensor] | None = None
          ) -> Any:
    """A record node as the tree it stands for, its datasets registered (``into``: the live tensors by key)."""
    if not isinstance(node, list) or len(node) != 2 or not isinstance(node[1], list):
        raise r.fail("damaged metadata record: a damaged node")
    kind, items = node
    if kind == "dict":
        out: dict[Any, Any] = {}
        for t, k, v in items:
            k = int(k) if t == "int" else k
            out[k] = _leaf(r, rec, v, used, into.get(k) if into is not None else None, k)
        return out
    if kind in ("list", "tuple"):
        seq = [_leaf(r, rec, v, used) for v in items]
        return seq if kind == "list" else tuple(seq)
    raise r.fail(f"damaged metadata record: unknown node kind {kind!r}")


def _leaf(r: _Reader, rec: record.Record, v: Any, used: set[int], target: Any = None, key: Any = None) -> Any:
    """One item of a node: a JSON value, a dataset (registered) or a node."""
    if isinstance(v, list) and len(v) == 2 and v[0] == "json":
        return v[1]
    if isinstance(v, list) and len(v) == 2 and v[0] == "array":
        i = v[1]
        if not isinstance(i, int) or not 0 <= i < len(rec.data) or i in used:
            raise r.fail("damaged metadata record: a dataset index out of range or used twice")
        used.add(i)
        e = rec.data[i]
        r.where = e.name
        return r.register(e.name, e.shape, e.dtype, e.torch_dtype, e.numpy, e.digest, e.offset, target, key)
    return _node(r, rec, v, used)
