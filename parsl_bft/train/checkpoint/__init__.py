"""HDF5 checkpoints: atomic, checksummed, never unpickled, readable with h5ls / h5dump.

The file layout is in ``format``'s docstring. Every dataset carries an xxh3-64 checksum of its bytes, verified on
load; a damaged file is reported by dataset name and the store falls back to the newest good checkpoint. Writes go
to a temporary file that is flushed, fsynced and renamed, so a crash mid-write leaves the previous checkpoint
untouched.

Modules: ``format`` (constants, TrainingState, CheckpointError, NewerFormatError, the metadata checksum, the
header), ``record`` (format 3's metadata record), ``writer`` (save_checkpoint), ``reader`` (load_checkpoint: every
file is untrusted input), ``loading`` (the memory a load reads into), ``staging`` (reads onto an accelerator),
``background`` (BackgroundSave), ``store`` (CheckpointStore: retention, damaged files, newer formats kept,
staging), ``rng`` (generator states), ``files`` (temporaries, fault points).
"""
from .background import BackgroundSave
from .format import FORMAT, VERSION, CheckpointError, NewerFormatError, TrainingState, finite_weights
from .reader import load_checkpoint
from .rng import capture_rng, restore_rng
from .store import CheckpointStore
from .writer import save_checkpoint

__all__ = ["FORMAT", "VERSION", "BackgroundSave", "CheckpointError", "CheckpointStore", "NewerFormatError",
           "TrainingState", "capture_rng", "finite_weights", "load_checkpoint", "restore_rng", "save_checkpoint"]
