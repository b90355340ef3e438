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
import os
import random
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import xxhash

FORMAT = "parsl-bft-checkpoint"
VERSION = 1
_NUMPY_UNSUPPORTED = {torch.bfloat16: torch.int16}
for _name, _view in (("float8_e4m3fn", torch.int8), ("float8_e5m2", torch.int8),
                     ("float8_e4m3fnuz", torch.int8), ("float8_e5m2fnuz", torch.int8)):
    if hasattr(torch, _name):
        _NUMPY_UNSUPPORTED[getattr(torch, _name)] = _view
_BY_NAME = {str(d).removeprefix("torch."): d for d in _NUMPY_UNSUPPORTED}


class CheckpointError(Exception):
    """A checkpoint file that cannot be used; ``dataset`` names the damaged part when known."""

    def __init__(self, path: str, problem: str, dataset: str | None = None):
        self.path, self.problem, self.dataset = path, problem, dataset
        where = f" (dataset {dataset})" if dataset else ""
        super().__init__(f"{path}: {problem}{where}")


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
    random.setstate((st["python"][0], tuple(st["python"][1]), st["python"][2]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _np_state(s):
    return [s[0], np.asarray(s[1]), int(s[2]), int(s[3]), float(s[4])]


def _py_state(s):
    return [s[0], list(s[1]), s[2]]


# --- tree encoding -------------------------------------------------------------------------------
def _digest(a: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)


def _write_tree(g: h5py.Group, obj: Any, manifest: list[str]) -> None:
    if isinstance(obj, dict):
        g.attrs["__kind__"] = "dict"
        keys = list(obj)
        g.attrs["__keys__"] = json.dumps([[type(k).__name__, k] for k in keys])
        for i, k in enumerate(keys):
            _write_item(g, f"k{i}", obj[k], manifest)
    elif isinstance(obj, (list, tuple)):
        g.attrs["__kind__"] = type(obj).__name__
        g.attrs["__len__"] = len(obj)
        for i, v in enumerate(obj):
            _write_item(g, f"i{i}", v, manifest)
    else:
        raise TypeError(f"cannot store {type(obj).__name__} as a tree")


def _write_item(g: h5py.Group, name: str, v: Any, manifest: list[str]) -> None:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        attrs = {"torch_dtype": str(t.dtype).removeprefix("torch.")}
        if t.dtype in _NUMPY_UNSUPPORTED:
            t = t.view(_NUMPY_UNSUPPORTED[t.dtype])
        _write_array(g, name, t.numpy(), attrs, manifest)
    elif isinstance(v, np.ndarray):
        _write_array(g, name, v, {"numpy": 1}, manifest)
    elif isinstance(v, (dict, list, tuple)):
        _write_tree(g.create_group(name), v, manifest)
    elif v is None or isinstance(v, (bool, int, float, str)):
        g.attrs[f"json:{name}"] = json.dumps(v)
    elif isinstance(v, (np.integer, np.floating)):
        g.attrs[f"json:{name}"] = json.dumps(v.item())
    else:
        raise TypeError(f"cannot store {type(v).__name__} in a checkpoint (at {g.name}/{name})")


def _write_array(g: h5py.Group, name: str, a: np.ndarray, attrs: dict, manifest: list[str]) -> None:
    d = g.create_dataset(name, data=a)
    for k, v in attrs.items():
        d.attrs[k] = v
    d.attrs["xxh3"] = _digest(a)
    manifest.append(d.name)


def _read_tree(path: str, g: h5py.Group) -> Any:
    kind = g.attrs.get("__kind__")
    if kind == "dict":
        keys = json.loads(g.attrs["__keys__"])
        return {(int(k) if t == "int" else k): _read_item(path, g, f"k{i}") for i, (t, k) in enumerate(keys)}
    if kind in ("list", "tuple"):
        items = [_read_item(path, g, f"i{i}") for i in range(int(g.attrs["__len__"]))]
        return items if kind == "list" else tuple(items)
    raise CheckpointError(path, f"unknown group kind {kind!r}", g.name)


def _read_item(path: str, g: h5py.Group, name: str) -> Any:
    if f"json:{name}" in g.attrs:
        return json.loads(g.attrs[f"json:{name}"])
    if name not in g:
        raise CheckpointError(path, "missing entry", f"{g.name}/{name}")
    obj = g[name]
    if isinstance(obj, h5py.Group):
        return _read_tree(path, obj)
    a = np.empty(obj.shape, dtype=obj.dtype)
    if a.size:
        obj.read_direct(a)
    if _digest(a) != obj.attrs.get("xxh3"):
        raise CheckpointError(path, "checksum mismatch: the data is damaged", obj.name)
    if "numpy" in obj.attrs:
        return a
    t = torch.from_numpy(a)
    dt = obj.attrs.get("torch_dtype", "")
    if dt in _BY_NAME:
        t = t.view(_BY_NAME[dt])
    return t


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


def save_checkpoint(path: str | Path, state: TrainingState, *, fsync: bool = True) -> Path:
    """Write ``state`` atomically to ``path``."""
    path = Path(path)
    tmp = _temporary(path)
    manifest: list[str] = []
    try:
        with h5py.File(tmp, "w", libver="latest") as f:
            f.attrs.update({"format": FORMAT, "version": VERSION, "step": state.step, "epoch": state.epoch,
                            "samples_done": state.samples_done, "data_position": state.data_position,
                            "created": time.time(), "job": json.dumps(state.job),
                            "metrics": json.dumps(state.metrics), "extra": json.dumps(state.extra)})
            for key in ("model", "optimizer", "scheduler", "rng"):
                obj = getattr(state, key)
                if obj is not None:
                    _write_tree(f.create_group(key), dict(obj), manifest)
                    _fault(f"save:{key}")
            f.attrs["manifest"] = json.dumps(manifest)
            f.flush()
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
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


def load_checkpoint(path: str | Path) -> TrainingState:
    """Read and verify one checkpoint; raises CheckpointError naming what is wrong."""
    p = str(path)
    try:
        f = h5py.File(p, "r")
    except (OSError, ValueError) as e:
        raise CheckpointError(p, f"not a readable HDF5 file ({e})") from None
    with f:
        if f.attrs.get("format") != FORMAT:
            raise CheckpointError(p, "not a parsl-bft checkpoint")
        if int(f.attrs.get("version", 0)) > VERSION:
            raise CheckpointError(p, f"written by a newer parsl-bft (format version {f.attrs['version']})")
        try:
            manifest = json.loads(f.attrs["manifest"])
            missing = [d for d in manifest if d not in f]
            if missing:
                raise CheckpointError(p, "missing dataset", missing[0])
            parts = {k: _read_tree(p, f[k]) if k in f else None for k in ("model", "optimizer", "scheduler", "rng")}
            return TrainingState(model=parts["model"] or {}, optimizer=parts["optimizer"],
                                 scheduler=parts["scheduler"], rng=parts["rng"], step=int(f.attrs["step"]),
                                 epoch=int(f.attrs["epoch"]), samples_done=int(f.attrs["samples_done"]),
                                 data_position=int(f.attrs["data_position"]), job=json.loads(f.attrs["job"]),
                                 metrics=json.loads(f.attrs["metrics"]), extra=json.loads(f.attrs["extra"]))
        except CheckpointError:
            raise
        except (KeyError, OSError, ValueError, TypeError) as e:
            raise CheckpointError(p, f"damaged structure: {e}") from None


_NAME = re.compile(r"^ckpt-(\d{9})\.h5$")


class CheckpointStore:
    """A directory of checkpoints of one job: keeps the last ``keep``, resumes from the newest good one."""

    def __init__(self, directory: str | Path, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.skipped: list[CheckpointError] = []   # damaged files met by the last latest()
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
        return sorted((p for p in self.dir.iterdir() if _NAME.match(p.name)), reverse=True)

    def save(self, state: TrainingState, *, fsync: bool = True) -> Path:
        path = save_checkpoint(self.dir / f"ckpt-{state.step:09d}.h5", state, fsync=fsync)
        for old in self.paths()[self.keep:]:
            old.unlink(missing_ok=True)
        return path

    def latest(self) -> TrainingState | None:
        """The newest checkpoint that loads and verifies; damaged ones are recorded in ``skipped``."""
        self.skipped = []
        for p in self.paths():
            try:
                return load_checkpoint(p)
            except CheckpointError as e:
                self.skipped.append(e)
        return None

    def stage_to(self, directory: str | Path) -> Path | None:
        """Copy the newest checkpoint that verifies into another directory (another site's file system),
        atomically; returns its path there, None when there is nothing to copy. How a job moves between sites."""
        for p in self.paths():
            try:
                load_checkpoint(p)
            except CheckpointError as e:
                self.skipped.append(e)
                continue
            dst = CheckpointStore(directory, keep=self.keep).dir / p.name
            if not dst.exists():
                tmp = _temporary(dst)
                shutil.copyfile(p, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dst)
            return dst
        return None
