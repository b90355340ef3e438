"""HDF5 checkpoints: atomic, checksummed, never unpickled, readable with h5ls / h5dump.

Layout of ``ckpt-<step>.h5``::

    /                 attrs: format, version, step, epoch, samples_done, data_position, created,
                             job (JSON), metrics (JSON), extra (JSON), manifest (JSON list of datasets)
    /model/<name>     one dataset per tensor of the state dict
    /optimizer/...    the optimizer state dict as a tree of groups (dicts, lists) and datasets
    /scheduler/...    LR scheduler state, same encoding
    /rng/...          torch (CPU and CUDA) generator states, numpy's and Python's

Tensors keep their dtype; those numpy cannot hold (bfloat16, float8) are stored as same-width integers with
the real dtype in the ``torch_dtype`` attribute. Scalars, strings and None live in JSON attributes. Every
dataset carries an xxh3-64 checksum of its bytes, verified on load; a damaged file is reported by dataset name
and the store falls back to the newest good checkpoint. Writes go to a temporary file that is flushed, fsynced
and renamed, so a crash mid-write leaves the previous checkpoint untouched.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import random
import re
import shutil
import socket
import stat
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import h5py
import numpy as np
import torch
import xxhash

from ..errors import ParslBftError

FORMAT = "parsl-bft-checkpoint"
VERSION = 2                  # 2: a checksum over the metadata too (attributes, dtypes, shapes)
_NUMERIC_KINDS = "biufc"     # the only dataset types a checkpoint holds
_PIECE = 1 << 18             # data is read and hashed in pieces this large: each hashed while still in the core's
                             # L2 cache (half the hash's cost with 4 MiB pieces, measured)
_MAPPED_MIN = 1 << 20        # datasets this large are loaded into a memory mapping of their own (see _empty)
_NUMPY_UNSUPPORTED = {torch.bfloat16: torch.int16}
for _name, _view in (("float8_e4m3fn", torch.int8), ("float8_e5m2", torch.int8),
                     ("float8_e4m3fnuz", torch.int8), ("float8_e5m2fnuz", torch.int8)):
    if hasattr(torch, _name):
        _NUMPY_UNSUPPORTED[getattr(torch, _name)] = _view
_BY_NAME = {str(d).removeprefix("torch."): d for d in _NUMPY_UNSUPPORTED}


class CheckpointError(ParslBftError):
    """A checkpoint file that cannot be used; ``dataset`` names the damaged part when known. ``overwritten``: a
    load ``into`` live tensors had begun writing them when the damage showed (they hold part of this file);
    ``written`` names them (their keys in ``into``)."""

    def __init__(self, path: str, problem: str, dataset: str | None = None, *, written: tuple = ()):
        self.path, self.problem, self.dataset, self.written = path, problem, dataset, tuple(written)
        where = f" (dataset {dataset})" if dataset else ""
        super().__init__(f"{path}: {problem}{where}")

    @property
    def overwritten(self) -> bool:
        return bool(self.written)


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


def capture_rng() -> dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "numpy": _np_state(np.random.get_state()),
          "python": _py_state(random.getstate())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = list(torch.cuda.get_rng_state_all())
    return st


def restore_rng(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(tuple(st["numpy"]))
    random.setstate((st["python"][0], tuple(int(x) for x in st["python"][1]), st["python"][2]))   # older files: a list
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _np_state(s):
    return [s[0], np.asarray(s[1]), int(s[2]), int(s[3]), float(s[4])]


def _py_state(s):
    # one array, not 625 ints: each int was an HDF5 attribute (~0.03 s of CPU a save, ~0.04 s a restore)
    return [s[0], np.asarray(s[1], dtype=np.uint32), s[2]]


# --- tree encoding -------------------------------------------------------------------------------
def _digest(a: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)


def _plain(v: Any) -> Any:
    """An attribute value as Python sees it, the same whether just written or read back."""
    return v.item() if isinstance(v, np.generic) else v


class _Meta:
    """The metadata checksum (format 2): every attribute, dataset name, dtype and shape, fed in the order the
    tree is written and read, so that a damaged JSON attribute or a changed dtype is caught like damaged data."""

    def __init__(self) -> None:
        self.h = xxhash.xxh3_64()

    def add(self, *parts: Any) -> None:
        self.h.update(repr(tuple(_plain(p) for p in parts)).encode())
        self.h.update(b"\0")

    def hexdigest(self) -> str:
        return self.h.hexdigest()


class _Writer:
    def __init__(self) -> None:
        self.manifest: list[str] = []
        self.meta = _Meta()
        self.data: list[tuple[int, np.ndarray]] = []    # (file offset, array): written after the layout

    def attr(self, obj, name: str, value: Any) -> None:
        obj.attrs[name] = value
        self.meta.add(obj.name, name, value)


def _write_tree(g: h5py.Group, obj: Any, w: _Writer) -> None:
    if isinstance(obj, dict):
        w.attr(g, "__kind__", "dict")
        keys = list(obj)
        w.attr(g, "__keys__", json.dumps([[type(k).__name__, k] for k in keys]))
        for i, k in enumerate(keys):
            _write_item(g, f"k{i}", obj[k], w)
    elif isinstance(obj, (list, tuple)):
        w.attr(g, "__kind__", type(obj).__name__)
        w.attr(g, "__len__", len(obj))
        for i, v in enumerate(obj):
            _write_item(g, f"i{i}", v, w)
    else:
        raise TypeError(f"cannot store {type(obj).__name__} as a tree")


def _write_item(g: h5py.Group, name: str, v: Any, w: _Writer) -> None:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        attrs = {"torch_dtype": str(t.dtype).removeprefix("torch.")}
        if t.dtype in _NUMPY_UNSUPPORTED:
            t = t.view(_NUMPY_UNSUPPORTED[t.dtype])
        _write_array(g, name, t.numpy(), attrs, w)
    elif isinstance(v, np.ndarray):
        _write_array(g, name, v, {"numpy": 1}, w)
    elif isinstance(v, (dict, list, tuple)):
        w.meta.add(g.name, name, "group")
        _write_tree(g.create_group(name), v, w)
    elif v is None or isinstance(v, (bool, int, float, str)):
        w.attr(g, f"json:{name}", json.dumps(v))
    elif isinstance(v, (np.integer, np.floating)):
        w.attr(g, f"json:{name}", json.dumps(v.item()))
    else:
        raise TypeError(f"cannot store {type(v).__name__} in a checkpoint (at {g.name}/{name})")


def _layout():
    """Contiguous, placed in the file when created, never filled: h5py lays the file out, the bytes are then
    written straight to their offsets (``_write_data``) - one pass at disk speed, no HDF5 copy in between."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return dcpl


def _write_data(path: Path, data: list[tuple[int, np.ndarray]], fsync: bool) -> None:
    """Array bytes at their dataset offsets (the GIL is released while the kernel copies them)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, a in data:
            buf = memoryview(a.reshape(-1).view(np.uint8))
            while len(buf):                      # pwrite may write less than asked (large buffers)
                n = os.pwrite(fd, buf, offset)
                buf, offset = buf[n:], offset + n
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_array(g: h5py.Group, name: str, a: np.ndarray, attrs: dict, w: _Writer) -> None:
    if a.dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(f"cannot store a {a.dtype} array in a checkpoint (at {g.name}/{name})")
    d = g.create_dataset(name, shape=a.shape, dtype=a.dtype, dcpl=_layout())
    offset = d.id.get_offset() if a.size else None
    if offset is not None:
        w.data.append((offset, np.ascontiguousarray(a)))
    elif a.size:                                 # a scalar: HDF5 places it itself
        d[()] = a
    w.meta.add(d.name, "dataset", a.dtype.str, tuple(a.shape))
    for k, v in attrs.items():
        w.attr(d, k, v)
    w.attr(d, "xxh3", _digest(a))
    w.manifest.append(d.name)


@dataclass
class _Pending:
    """One dataset's data, read once the whole file's metadata has verified."""

    name: str
    offset: int | None           # None: compact or empty, already read (``got``) through HDF5
    array: np.ndarray
    digest: Any                  # the stored checksum (whatever the attribute holds)
    got: str | None = None
    live: bool = False           # ``array`` is a live tensor's memory (``load_checkpoint(into=...)``)
    key: Any = None              # its key in ``into``


class _Reader:
    """Reads one untrusted file (checkpoints are staged between sites: they are input). Hard links only; only
    numeric datasets stored contiguously (or compactly) inside the file itself - no external links, external raw
    storage, virtual layouts or filters; every declared size, and where the data ends, is bounded by the file's
    own size before anything is allocated. ``where`` names the part being read, for the error.

    Two passes: the tree (attributes, names, shapes: the metadata checksum) registers each dataset's data, and
    ``fill`` reads it once all that has verified - into fresh memory first, into the live tensors (``into``)
    last, so a file whose metadata, optimizer state or length is damaged never touches the live model."""

    def __init__(self, path: str, f: h5py.File, size: int, arrays: bool = True, fd: int | None = None):
        self.path, self.f, self.size, self.arrays, self.fd = path, f, size, arrays, fd
        self.where: str | None = None
        self.read: list[str] = []
        self.meta = _Meta()
        self.pending: list[_Pending] = []
        self.written: list = []      # keys of the live tensors written so far

    def fail(self, problem: str) -> CheckpointError:
        return CheckpointError(self.path, problem, self.where, written=self.written)

    def fill(self) -> None:
        """Read and verify every registered dataset, live tensors last (``sorted`` is stable)."""
        for p in sorted(self.pending, key=lambda p: p.live):
            self.where = p.name
            if p.offset is not None:
                if p.live:
                    self.written.append(p.key)
                p.got = _read_into(self.fd, p.offset, p.array)
            if p.got is None:
                raise self.fail("data past the end of the file")
            if p.got != p.digest:
                raise self.fail("checksum mismatch: the data is damaged")
        self.where = None

    def attr(self, obj, name: str, default: Any = KeyError) -> Any:
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

    def text(self, obj, name: str) -> str:
        v = self.attr(obj, name)
        if not isinstance(v, str):
            raise self.fail(f"attribute {name!r} is not text")
        return v

    def json(self, obj, name: str) -> Any:
        return json.loads(self.text(obj, name))

    def child(self, g: h5py.Group, name: str):
        self.where = f"{g.name.rstrip('/')}/{name}"
        link = g.get(name, getlink=True)
        if link is None:
            raise self.fail("missing entry")
        if not isinstance(link, h5py.HardLink):
            raise self.fail(f"{type(link).__name__} not allowed in a checkpoint (only hard links)")
        return g[name]

    def tree(self, g: h5py.Group, into: Mapping[str, torch.Tensor] | None = None) -> Any:
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
        self.where = ds.name
        dcpl = ds.id.get_create_plist()
        if dcpl.get_layout() not in (h5py.h5d.CONTIGUOUS, h5py.h5d.COMPACT):
            raise self.fail("only contiguous datasets are allowed (chunked or virtual layout)")
        if dcpl.get_external_count():
            raise self.fail("external raw storage is not allowed")
        if dcpl.get_nfilters():
            raise self.fail("filters are not allowed")
        dt = ds.dtype
        if dt.kind not in _NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None or dt.itemsize > 16:
            raise self.fail(f"dataset type {dt} is not allowed")
        if ds.shape is None:
            raise self.fail("dataset without a shape")
        declared = math.prod(ds.shape) * dt.itemsize
        if declared > self.size:
            raise self.fail(f"declares {declared:,} bytes, more than the whole file ({self.size:,} bytes)")
        self.meta.add(ds.name, "dataset", dt.str, tuple(ds.shape))
        numpy = self.attr(ds, "numpy", None) if "numpy" in ds.attrs else None
        dtn = self.attr(ds, "torch_dtype", "") if "torch_dtype" in ds.attrs else ""
        digest = self.attr(ds, "xxh3", None)
        self.read.append(ds.name)
        offset = ds.id.get_offset() if declared and self.fd is not None else None
        if offset is not None and offset + declared > self.size:
            raise self.fail("data past the end of the file")
        if not self.arrays:
            return None
        live = _live_view(target, ds.shape, dt, dtn) if offset is not None and numpy is None else None
        a = _empty(ds.shape, dt) if live is None else live
        got = None
        if offset is None:                       # compact (HDF5 places it itself) or empty: small, read now
            if a.size:
                ds.read_direct(a)
            got = _digest(a)
        self.pending.append(_Pending(ds.name, offset, a, digest, got, live is not None, key))
        if live is not None:
            return target
        if numpy is not None:
            return a
        t = torch.from_numpy(a)
        if dtn in _BY_NAME:
            t = t.view(_BY_NAME[dtn])
        return t


def _live_view(target: Any, shape: tuple, dt: np.dtype, dtn: str) -> np.ndarray | None:
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
    a = t.view(_NUMPY_UNSUPPORTED.get(t.dtype, t.dtype)).numpy()
    return a if a.dtype == dt else None


def _empty(shape: tuple, dt: np.dtype) -> np.ndarray:
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
    buf, h = memoryview(a.reshape(-1).view(np.uint8)), xxhash.xxh3_64()
    for pos in range(0, len(buf), _PIECE):
        piece = buf[pos:pos + _PIECE]
        if os.preadv(fd, [piece], offset + pos) != len(piece):
            return None
        h.update(piece)
    return h.hexdigest()


def _fault(point: str) -> None:
    """Fault injection for tests: PARSL_BFT_FAULT=<point> kills this process (SIGKILL) at that point. A chaos
    test arms one-shot kills instead: a file named <point> in the directory PARSL_BFT_CHAOS_ARM is claimed
    (renamed, so exactly one process fires it) by the next process that reaches the point."""
    kill = os.environ.get("PARSL_BFT_FAULT") == point
    arm = os.environ.get("PARSL_BFT_CHAOS_ARM")
    if arm and not kill:
        trigger = Path(arm) / point.replace(":", "_")
        try:
            os.rename(trigger, trigger.with_name(f"{trigger.name}.fired-{_HOST}-{os.getpid()}"))
            kill = True
        except OSError:
            pass
    if kill:
        os.kill(os.getpid(), 9)


# --- files ---------------------------------------------------------------------------------------
_HOST = socket.gethostname().replace("-", "_")
_STALE_FOREIGN_S = 3600.0     # another host's temporary untouched this long: its writer is gone


def _temporary(path: Path) -> Path:
    """Where a save is written before it is renamed into place: named by host AND pid, because pids of other
    nodes (a job directory on a shared file system) mean nothing here."""
    return path.with_name(f".{path.name}.tmp-{_HOST}-{os.getpid()}")


_ROOT_ATTRS = ("format", "version", "step", "epoch", "samples_done", "data_position", "created", "job", "metrics",
               "extra")
_PARTS = ("model", "optimizer", "scheduler", "rng")


def save_checkpoint(path: str | Path, state: TrainingState, *, fsync: bool = True) -> Path:
    """Write ``state`` atomically to ``path`` (readable by its owner only)."""
    path = Path(path)
    tmp = _temporary(path)
    w = _Writer()
    try:
        with h5py.File(tmp, "w", libver="latest") as f:
            values = {"format": FORMAT, "version": VERSION, "step": state.step, "epoch": state.epoch,
                      "samples_done": state.samples_done, "data_position": state.data_position,
                      "created": time.time(), "job": json.dumps(state.job), "metrics": json.dumps(state.metrics),
                      "extra": json.dumps(state.extra)}
            for k in _ROOT_ATTRS:
                w.attr(f, k, values[k])
            for key in _PARTS:
                obj = getattr(state, key)
                w.meta.add("/", key, "absent" if obj is None else "group")
                if obj is not None:
                    _write_tree(f.create_group(key), dict(obj), w)
            w.attr(f, "manifest", json.dumps(w.manifest))
            f.attrs["meta_xxh3"] = w.meta.hexdigest()
        os.chmod(tmp, 0o600)
        _fault("save:optimizer")                  # the layout is there, the data not yet: a torn file
        _write_data(tmp, w.data, fsync)
        os.replace(tmp, path)
        if fsync:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def load_checkpoint(path: str | Path, *, arrays: bool = True,
                    into: Mapping[str, torch.Tensor] | None = None) -> TrainingState:
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
    checkpoint or built again. A format-1 file (no metadata checksum) loads as without ``into``."""
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise CheckpointError(p, f"cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(p, "not a regular file")
    try:
        f = h5py.File(p, "r")
    except Exception as e:  # noqa: BLE001 - h5py raises OSError, ValueError, RuntimeError ... on damaged files
        raise CheckpointError(p, f"not a readable HDF5 file ({type(e).__name__}: {e})") from None
    # HDF5's own descriptor, and that file's size: a save may have replaced the file at this path since the stat
    fd = f.id.get_vfd_handle()
    r = _Reader(p, f, os.fstat(fd).st_size if fd is not None else st.st_size, arrays, fd)
    try:
        with f:
            if r.attr(f, "format", None) != FORMAT:
                raise CheckpointError(p, "not a parsl-bft checkpoint")
            version = int(r.attr(f, "version", 0))
            if version > VERSION:
                raise CheckpointError(p, f"written by a newer parsl-bft (format version {version})")
            root = {k: r.attr(f, k) for k in _ROOT_ATTRS[2:]}
            parts: dict[str, Any] = {}
            for key in _PARTS:
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
            manifest = r.json(f, "manifest")
            if version >= 2 and r.meta.hexdigest() != r.attr(f, "meta_xxh3", None):
                raise CheckpointError(p, "metadata checksum mismatch: attributes, names or shapes are damaged")
            if not isinstance(manifest, list):
                raise CheckpointError(p, "damaged manifest")
            missing = sorted(set(map(str, manifest)) - set(r.read))
            if missing:
                raise CheckpointError(p, "missing dataset", missing[0])
            state = TrainingState(model=parts["model"] or {}, optimizer=parts["optimizer"],
                                  scheduler=parts["scheduler"], rng=parts["rng"], step=_count(root["step"]),
                                  epoch=_count(root["epoch"]), samples_done=_count(root["samples_done"]),
                                  data_position=_count(root["data_position"]), job=json.loads(root["job"]),
                                  metrics=json.loads(root["metrics"]), extra=json.loads(root["extra"]))
            if not isinstance(state.model, dict) or not isinstance(state.job, dict) \
                    or not isinstance(state.metrics, list) or not isinstance(state.extra, dict):
                raise CheckpointError(p, "damaged structure: unexpected types")
            r.fill()
            return state
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - RuntimeError (HDF5), MemoryError, RecursionError (deep JSON), ...
        raise CheckpointError(p, f"damaged structure ({type(e).__name__}: {str(e)[:200]})", r.where,
                              written=r.written) from None


def _count(v: Any) -> int:
    v = _plain(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"not a count: {v!r}")
    return v


class BackgroundSave:
    """Saves off the training path: ``start`` copies the state into CPU buffers kept from one save to the next
    (the pause is that memory copy; ``prepare`` allocates and touches the buffers beforehand, on a thread, so
    not even the first save pays for fresh pages), then a thread runs ``write`` on the copy while training goes
    on. One save in flight: ``start`` during a write returns False (try again at the next step). ``wait`` joins
    the write and raises what it raised, so a failed background save fails the caller like a blocking one."""

    def __init__(self, write: Callable[[TrainingState], Path]):
        self._write = write
        self._buffers: dict[str, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last: Path | None = None            # the file of the last finished write

    def prepare(self, state: TrainingState) -> None:
        self._run(lambda: self._copy(state, "", fill=False))

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, state: TrainingState) -> bool:
        if self.busy():
            return False
        self.wait()
        copy = self._copy(state, "", fill=True)
        self._run(lambda: setattr(self, "last", self._write(copy)))
        return True

    def wait(self) -> Path | None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self.last

    def _run(self, fn: Callable[[], Any]) -> None:
        self.wait()

        def body() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits next
                self._error = e

        self._thread = threading.Thread(target=body, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _copy(self, obj: Any, key: str, fill: bool) -> Any:
        if isinstance(obj, TrainingState):
            return TrainingState(**{f.name: self._copy(getattr(obj, f.name), f.name, fill) for f in fields(obj)})
        if isinstance(obj, torch.Tensor):
            buf = self._buffers.get(key)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = self._buffers[key] = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=obj.is_cuda)
                if not fill:
                    buf.zero_()                  # touch the pages now, not during the pause
            if fill:
                _copy_tensor(buf, obj.detach())
            return buf
        if isinstance(obj, np.ndarray):
            return obj.copy()
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{key}/{k}", fill) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, f"{key}/{i}", fill) for i, v in enumerate(obj))
        return obj


def _copy_tensor(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, through memmove where it can: glibc's copy (rep movsb, non-temporal stores when large)
    ran at 1.3-1.5x the speed of copy_'s vector loop here, and this copy is the whole pause of a periodic save."""
    if src.device.type == "cpu" and src.layout == torch.strided and src.is_contiguous() and src.numel() \
            and not (src.is_conj() or src.is_neg()):
        np.copyto(_bytes(dst), _bytes(src))
    else:
        dst.copy_(src)                           # from a GPU: into pinned memory (a direct DMA)


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).numpy()


def finite_weights(model: dict[str, Any]) -> str | None:
    """The name of the first floating-point tensor holding NaN or infinity, None when all are finite."""
    for k, t in model.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            return str(k)
    return None


_NAME = re.compile(r"^ckpt-(\d{9})\.h5$")


class CheckpointStore:
    """A directory of checkpoints of one job: keeps the last ``keep``, resumes from the newest good one.

    Damaged checkpoints met on the way (by ``latest()``, ``stage_to()`` or pruning) are moved aside into
    ``damaged/`` - kept for a post-mortem, never counted among the ``keep`` - so pruning can never delete the
    newest checkpoint that verifies, nor the one just written."""

    def __init__(self, directory: str | Path, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.keep = keep
        self.skipped: list[CheckpointError] = []   # damaged files met by the last latest()
        self.latest_path: Path | None = None       # the file the last latest() loaded
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """A writer killed mid-save leaves ``.ckpt-*.tmp-HOST-PID``. Ours: drop it when that pid is gone.
        Another host's: it may be writing right now; drop it only when untouched for an hour."""
        for p in self.dir.glob(".ckpt-*.h5.tmp-*"):
            host, _, pid = p.name.rsplit(".tmp-", 1)[1].rpartition("-")
            try:
                if host == _HOST:
                    os.kill(int(pid), 0)
                elif time.time() - p.stat().st_mtime > _STALE_FOREIGN_S:
                    p.unlink(missing_ok=True)
            except (ProcessLookupError, ValueError, OverflowError):
                p.unlink(missing_ok=True)
            except (PermissionError, FileNotFoundError):
                pass

    def paths(self) -> list[Path]:
        """Checkpoint files, newest (highest step) first."""
        return sorted((p for p in self.dir.iterdir() if _NAME.match(p.name) and p.is_file()), reverse=True)

    def _set_aside(self, p: Path, err: CheckpointError) -> None:
        """Move a checkpoint that does not verify out of the way (not deleted: it may be wanted for a post-mortem,
        and a file that failed to read over a flaky file system is still there)."""
        self.skipped.append(err)
        aside = self.dir / "damaged"
        try:
            aside.mkdir(mode=0o700, exist_ok=True)
            os.replace(p, aside / f"{p.name}.{int(time.time())}-{_HOST}-{os.getpid()}")
        except OSError:
            pass                                  # another process moved it already, or read-only: skip it anyway

    def save(self, state: TrainingState, *, fsync: bool = True) -> Path:
        """Write the checkpoint of ``state.step``, then keep the ``keep`` newest: the one just written always,
        older ones by step. Files of a higher step than this one (left by a fenced fragment, or damaged since the
        last ``latest()``) count only when they verify; the others are set aside."""
        path = save_checkpoint(self.dir / f"ckpt-{state.step:09d}.h5", state, fsync=fsync)
        kept, newest_good = [path], False
        for p in self.paths():
            if p == path:
                continue
            if p.name > path.name:
                try:
                    load_checkpoint(p)
                except CheckpointError as e:
                    self._set_aside(p, e)
                    continue
                if not newest_good:               # the newest checkpoint that verifies is never deleted
                    newest_good = True
                    kept.append(p)
                    continue
            if len(kept) < self.keep:
                kept.append(p)
            else:
                p.unlink(missing_ok=True)
        return path

    def latest(self, *, arrays: bool = True, into: Mapping[str, torch.Tensor] | None = None) -> TrainingState | None:
        """The newest checkpoint that loads and verifies; damaged ones are recorded in ``skipped`` and set aside.
        ``arrays=False``: only where it stands; ``into``: read into the live model (see ``load_checkpoint``: load
        the result into it with ``load_state_dict``, which also rewrites what a damaged newer file overwrote).
        When none verifies but one had already overwritten part of ``into``, that model is unusable and nothing
        can restore it: CheckpointError (not None, which would train the half-overwritten model from scratch);
        so too when the one that verifies lacks a tensor a damaged one overwrote (load_state_dict would leave it
        as it is without a word where a key may be missing, e.g. BatchNorm's num_batches_tracked): that file is
        kept, and restores into a model built again."""
        self.skipped = []
        self.latest_path = None
        written: set = set()
        for p in self.paths():
            try:
                st = load_checkpoint(p, arrays=arrays, into=into)
            except CheckpointError as e:
                written.update(e.written)
                self._set_aside(p, e)
                continue
            lost = written - set(st.model)
            if lost:
                raise CheckpointError(str(p), f"a damaged newer checkpoint was read into the live model, and this "
                                      f"one does not hold {len(lost)} of the tensors it overwrote (e.g. "
                                      f"{sorted(map(str, lost))[0]!r}): build the model again and restore")
            self.latest_path = p
            return st
        if written:
            raise CheckpointError(str(self.dir), "no checkpoint verifies, and a damaged one was read into the live "
                                  "model before its damage showed: build the model again and start from scratch")
        return None

    def stage_to(self, directory: str | Path) -> Path | None:
        """Copy the newest checkpoint that verifies into another directory (another site's file system),
        atomically; returns its path there, None when there is nothing to copy. How a job moves between sites."""
        for p in self.paths():
            try:
                load_checkpoint(p)
            except CheckpointError as e:
                self._set_aside(p, e)
                continue
            dst = CheckpointStore(directory, keep=self.keep).dir / p.name
            if not dst.exists():
                tmp = _temporary(dst)
                shutil.copyfile(p, tmp)
                os.chmod(tmp, 0o600)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dst)
            return dst
        return None
