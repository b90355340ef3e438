"""Writing a checkpoint: h5py lays the file out, then the array bytes go straight to their offsets.

Writes go to a temporary file that is flushed, fsynced and renamed, so a crash mid-write leaves the previous
checkpoint untouched.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from .files import fault, temporary
from .format import (
    FORMAT,
    NUMERIC_KINDS,
    NUMPY_UNSUPPORTED,
    PARTS,
    ROOT_ATTRS,
    VERSION,
    MetaChecksum,
    TrainingState,
    digest,
)


class _Writer:
    def __init__(self) -> None:
        self.manifest: list[str] = []
        self.meta = MetaChecksum()
        self.data: list[tuple[int, np.ndarray]] = []    # (file offset, array): written after the layout

    def attr(self, obj: Any, name: str, value: Any) -> None:
        """Set an attribute and feed it to the metadata checksum."""
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
        if t.dtype in NUMPY_UNSUPPORTED:
            t = t.view(NUMPY_UNSUPPORTED[t.dtype])
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


def _layout() -> Any:
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
            buf = a.reshape(-1).view(np.uint8).data
            while len(buf):                      # pwrite may write less than asked (large buffers)
                n = os.pwrite(fd, buf, offset)
                buf, offset = buf[n:], offset + n
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_array(g: h5py.Group, name: str, a: np.ndarray, attrs: dict[str, Any], w: _Writer) -> None:
    if a.dtype.kind not in NUMERIC_KINDS:
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
    w.attr(d, "xxh3", digest(a))
    w.manifest.append(d.name)


def _write_layout(tmp: Path, state: TrainingState, w: _Writer) -> None:
    """The whole file but the arrays' bytes: attributes, groups, datasets placed (their data in ``w.data``)."""
    with h5py.File(tmp, "w", libver="latest") as f:
        values = {"format": FORMAT, "version": VERSION, "step": state.step, "epoch": state.epoch,
                  "samples_done": state.samples_done, "data_position": state.data_position,
                  "created": time.time(), "job": json.dumps(state.job), "metrics": json.dumps(state.metrics),
                  "extra": json.dumps(state.extra)}
        for k in ROOT_ATTRS:
            w.attr(f, k, values[k])
        for key in PARTS:
            obj = getattr(state, key)
            w.meta.add("/", key, "absent" if obj is None else "group")
            if obj is not None:
                _write_tree(f.create_group(key), dict(obj), w)
        w.attr(f, "manifest", json.dumps(w.manifest))
        f.attrs["meta_xxh3"] = w.meta.hexdigest()


def _fsync_directory(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save_checkpoint(path: str | Path, state: TrainingState, *, fsync: bool = True) -> Path:
    """Write ``state`` atomically to ``path`` (readable by its owner only)."""
    path = Path(path)
    tmp = temporary(path)
    w = _Writer()
    try:
        _write_layout(tmp, state, w)
        os.chmod(tmp, 0o600)
        fault("save:optimizer")                   # the layout is there, the data not yet: a torn file
        _write_data(tmp, w.data, fsync)
        os.replace(tmp, path)
        if fsync:
            _fsync_directory(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
