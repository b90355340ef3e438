"""Writing a checkpoint: h5py lays the file out, then the header and metadata record go into its user block and
the array bytes straight to their offsets.

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

from .files import fault, temporary
from .format import FORMAT, HEADER, PARTS, ROOT_ATTRS, VERSION, MetaChecksum, TrainingState, pack_header
from .record import Array, Encoded, encode, layout_digest


class _Writer:
    """One save's HDF5 pass: the metadata checksum as it goes, and the arrays whose bytes are written after it."""

    def __init__(self, enc: Encoded, userblock: int) -> None:
        self.enc, self.userblock = enc, userblock
        self.manifest: list[str] = []
        self.meta = MetaChecksum()
        self.data: list[Array] = []              # placed by HDF5, written by ``_write_data``

    def attr(self, obj: Any, name: str, value: Any) -> None:
        """Set an attribute and feed it to the metadata checksum."""
        obj.attrs[name] = value
        self.meta.add(obj.name, name, value)


def _write_tree(g: h5py.Group, node: list[Any], w: _Writer) -> None:
    """The HDF5 groups, attributes and datasets of one record node (``record.encode``), as format 2 wrote them."""
    kind, items = node
    w.attr(g, "__kind__", kind)
    if kind == "dict":
        w.attr(g, "__keys__", json.dumps([[t, k] for t, k, _ in items]))
        for i, (_, _, v) in enumerate(items):
            _write_item(g, f"k{i}", v, w)
    else:
        w.attr(g, "__len__", len(items))
        for i, v in enumerate(items):
            _write_item(g, f"i{i}", v, w)


def _write_item(g: h5py.Group, name: str, v: list[Any], w: _Writer) -> None:
    if v[0] == "array":
        _write_array(g, name, w.enc.arrays[v[1]], w)
    elif v[0] == "json":
        w.attr(g, f"json:{name}", json.dumps(v[1]))
    else:
        w.meta.add(g.name, name, "group")
        _write_tree(g.create_group(name), v, w)


def _layout() -> Any:
    """Contiguous, placed in the file when created, never filled: h5py lays the file out, the bytes are then
    written straight to their offsets (``_write_data``) - one pass at disk speed, no HDF5 copy in between."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return dcpl


def _write_data(fd: int, arrays: list[Array]) -> None:
    """Array bytes at their dataset offsets (the GIL is released while the kernel copies them)."""
    for a in arrays:
        buf, offset = a.array.reshape(-1).view(np.uint8).data, a.offset
        assert offset is not None
        while len(buf):                          # pwrite may write less than asked (large buffers)
            n = os.pwrite(fd, buf, offset)
            buf, offset = buf[n:], offset + n


def _write_array(g: h5py.Group, name: str, arr: Array, w: _Writer) -> None:
    a = arr.array
    d = g.create_dataset(name, shape=a.shape, dtype=a.dtype, dcpl=_layout())
    if a.size:
        offset = d.id.get_offset()
        # a scalar is placed by HDF5 when written, not when created; then its offset is known. (With a user block
        # HDF5 reports "no place yet" as the block's size - 1, not None.)
        if offset is None or offset < w.userblock:
            d[()] = a
            offset = d.id.get_offset()
        else:
            w.data.append(arr)
        arr.offset = offset
    w.meta.add(d.name, "dataset", a.dtype.str, tuple(a.shape))
    for k, v in arr.attrs.items():
        w.attr(d, k, v)
    w.attr(d, "xxh3", arr.digest)
    w.manifest.append(d.name)


def _write_layout(tmp: Path, root: dict[str, Any], w: _Writer) -> None:
    """The whole HDF5 file but the arrays' bytes: attributes, groups, datasets placed (their bytes in
    ``w.data``), behind a user block for the header and record."""
    with h5py.File(tmp, "w", libver="latest", userblock_size=w.userblock) as f:
        values = {"format": FORMAT, "version": VERSION, **root}
        for k in ROOT_ATTRS:
            w.attr(f, k, values[k])
        for key in PARTS:
            node = w.enc.parts[key]
            w.meta.add("/", key, "absent" if node is None else "group")
            if node is not None:
                _write_tree(f.create_group(key), node, w)
        w.attr(f, "manifest", json.dumps(w.manifest))
        f.attrs["meta_xxh3"] = w.meta.hexdigest()


def _encode(state: TrainingState) -> tuple[dict[str, Any], Encoded]:
    """The root attributes' values and the parts as record nodes."""
    root = {"step": state.step, "epoch": state.epoch, "samples_done": state.samples_done,
            "data_position": state.data_position, "created": time.time(), "job": json.dumps(state.job),
            "metrics": json.dumps(state.metrics), "extra": json.dumps(state.extra)}
    enc = Encoded()
    for key in PARTS:
        obj = getattr(state, key)
        enc.parts[key] = None if obj is None else encode(dict(obj), f"/{key}", enc)
    return root, enc


def _write(tmp: Path, state: TrainingState, fsync: bool) -> None:
    """The file at ``tmp``: the HDF5 layout, then (the layout's checksum known) the header and record into the
    user block and the arrays' bytes into their places."""
    root, enc = _encode(state)
    # the metrics history only in its HDF5 attribute (it grows with every step: not twice in the file); a restore
    # reads that one attribute, covered by the layout checksum
    indexed = {k: v for k, v in root.items() if k != "metrics"}
    w = _Writer(enc, enc.userblock(indexed))
    _write_layout(tmp, root, w)
    os.chmod(tmp, 0o600)
    fault("save:optimizer")                   # the layout is there, the data not yet: a torn file
    fd = os.open(tmp, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        record = enc.record(indexed, [w.userblock, size, layout_digest(fd, w.userblock, size, enc.ranges())])
        if HEADER + len(record) > w.userblock:
            raise AssertionError(f"checkpoint record of {len(record)} bytes outgrew its user block")
        os.pwrite(fd, pack_header(VERSION, w.userblock, record) + record, 0)
        _write_data(fd, w.data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


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
    try:
        _write(tmp, state, fsync)
        os.replace(tmp, path)
        if fsync:
            _fsync_directory(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
