"""Parsl configurations parsl-bft builds. The embedded default runs everything on the local machine."""
from __future__ import annotations

import os
import sys
from pathlib import Path

LOCAL_LABEL = "bft_local"


def ensure_venv_on_path() -> None:
    """HTEX starts interchange.py and process_worker_pool.py by name: the running Python's bin/ must be on PATH."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def local_config(workers: int = 8, run_dir: str = "runinfo", label: str = LOCAL_LABEL):
    """HighThroughputExecutor on a LocalProvider: one block, ``workers`` fragment slots. Parsl retries are off:
    a reclaimed or failed fragment is a normal event the orchestrator handles (resume from the checkpoint)."""
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    ensure_venv_on_path()
    return Config(
        executors=[HighThroughputExecutor(label=label, address="127.0.0.1", max_workers_per_node=workers,
                                          # a worker only waits for its fragment's rank processes: do not let
                                          # the core count (cores_per_worker=1) cap the number of fragment slots
                                          cores_per_worker=0.01,
                                          cpu_affinity="none", heartbeat_period=2, heartbeat_threshold=10,
                                          provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))],
        run_dir=run_dir, retries=0, strategy="none", initialize_logging=False,
    )
