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

Modules: ``format`` (constants, TrainingState, CheckpointError, the metadata checksum), ``writer``
(save_checkpoint), ``reader`` (load_checkpoint: every file is untrusted input), ``background`` (BackgroundSave),
``store`` (CheckpointStore: retention, damaged files, staging), ``rng`` (generator states), ``files``
(temporaries, fault points).
"""
from .background import BackgroundSave
from .format import FORMAT, VERSION, CheckpointError, TrainingState, finite_weights
from .reader import load_checkpoint
from .rng import capture_rng, restore_rng
from .store import CheckpointStore
from .writer import save_checkpoint

__all__ = ["FORMAT", "VERSION", "BackgroundSave", "CheckpointError", "CheckpointStore", "TrainingState",
           "capture_rng", "finite_weights", "load_checkpoint", "restore_rng", "save_checkpoint"]
