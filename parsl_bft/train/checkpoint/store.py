"""A directory of one job's checkpoints: retention, damaged files set aside, staging to another site, the
newest that verifies; a file of a newer format is kept and refused (NewerFormatError), never passed over."""
from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...errors import BadValue
from .files import HOST, STALE_FOREIGN_S, temporary
from .format import CheckpointError, NewerFormatError, TrainingState
from .reader import load_checkpoint
from .writer import save_checkpoint

_NAME = re.compile(r"^ckpt-(\d{9})\.h5$")


class CheckpointStore:
    """A directory of checkpoints of one job: keeps the last ``keep``, resumes from the newest good one.

    Damaged checkpoints met on the way (by ``latest()``, ``stage_to()`` or pruning) are moved aside into
    ``damaged/`` - kept for a post-mortem, never counted among the ``keep`` - so pruning can never delete the
    newest checkpoint that verifies, nor the one just written.

    A checkpoint written by a newer parsl-bft (``NewerFormatError``) is not damaged: it stays where it is, is
    never pruned in favour of older ones, and ``latest()`` raises rather than resume from an older checkpoint
    (or from scratch) behind it."""

    def __init__(self, directory: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise BadValue(f"keep must be >= 1, got {keep}")
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
                if host == HOST:
                    os.kill(int(pid), 0)
                elif time.time() - p.stat().st_mtime > STALE_FOREIGN_S:
                    p.unlink(missing_ok=True)
            except (ProcessLookupError, ValueError, OverflowError):
                p.unlink(missing_ok=True)
            except (PermissionError, FileNotFoundError):
                pass

    def paths(self) -> list[Path]:
        """Checkpoint files, newest (highest step) first."""
        return sorted((p for p in self.dir.iterdir() if _NAME.match(p.name) and p.is_file()), reverse=True)

    def newest_step(self) -> int:
        """The step of the newest checkpoint file, by its name (0: none); read nothing, verify nothing."""
        paths = self.paths()
        m = _NAME.match(paths[0].name) if paths else None
        return int(m.group(1)) if m else 0

    def _set_aside(self, p: Path, err: CheckpointError) -> None:
        """Move a checkpoint that does not verify out of the way (not deleted: it may be wanted for a post-mortem,
        and a file that failed to read over a flaky file system is still there)."""
        self.skipped.append(err)
        aside = self.dir / "damaged"
        try:
            aside.mkdir(mode=0o700, exist_ok=True)
            os.replace(p, aside / f"{p.name}.{int(time.time())}-{HOST}-{os.getpid()}")
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
                except NewerFormatError:
                    continue                      # kept, not counted: a newer parsl-bft reads it
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

    def latest(self, *, arrays: bool = True, into: Mapping[str, torch.Tensor] | None = None,
               device: str | torch.device | None = None) -> TrainingState | None:
        """The newest checkpoint that loads and verifies; damaged ones are recorded in ``skipped`` and set aside.
        ``arrays=False``: only where it stands; ``into``: read into the live model (see ``load_checkpoint``: load
        the result into it with ``load_state_dict``, which also rewrites what a damaged newer file overwrote);
        ``device``: large tensors are read onto that accelerator (see ``load_checkpoint``).
        When none verifies but one had already overwritten part of ``into``, that model is unusable and nothing
        can restore it: CheckpointError (not None, which would train the half-overwritten model from scratch);
        so too when the one that verifies lacks a tensor a damaged one overwrote (load_state_dict would leave it
        as it is without a word where a key may be missing, e.g. BatchNorm's num_batches_tracked): that file is
        kept, and restores into a model built again. A newer format's file met before one that verifies:
        NewerFormatError (it is kept)."""
        self.skipped = []
        self.latest_path = None
        written: set[Any] = set()
        for p in self.paths():
            try:
                st = load_checkpoint(p, arrays=arrays, into=into, device=device)
            except NewerFormatError:
                raise
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
        atomically; returns its path there, None when there is nothing to copy. How a job moves between sites.
        A newer format's file met first is copied as it is: the other site refuses it just the same."""
        for p in self.paths():
            try:
                load_checkpoint(p)
            except NewerFormatError:
                pass
            except CheckpointError as e:
                self._set_aside(p, e)
                continue
            dst = CheckpointStore(directory, keep=self.keep).dir / p.name
            if not dst.exists():
                tmp = temporary(dst)
                shutil.copyfile(p, tmp)
                os.chmod(tmp, 0o600)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dst)
            return dst
        return None
