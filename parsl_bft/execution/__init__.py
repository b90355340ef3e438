"""Running training on idle nodes through Parsl: providers, the orchestrator, the embedded default.

The names below are loaded on first use (PEP 562): importing a light submodule (``report``, ``statedir``,
``globus``, ``die_with_parent``) does not import torch or Parsl's executors, so `parsl-bft status` and the
remote commands' endpoint functions start fast. ``from parsl_bft.execution import TrainingJob`` works as before.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import LOCAL_LABEL, local_config
    from .orchestrator import Orchestrator
    from .pool import EmulatedPool, MultiPool, PilotPool, SitePool
    from .session import training_session
    from .training_job import TrainingJob

_WHERE = {
    "LOCAL_LABEL": "config", "local_config": "config", "Orchestrator": "orchestrator",
    "TrainingJob": "training_job", "EmulatedPool": "pool", "MultiPool": "pool", "PilotPool": "pool",
    "SitePool": "pool", "training_session": "session",
}

__all__ = ["LOCAL_LABEL", "EmulatedPool", "MultiPool", "Orchestrator", "PilotPool", "SitePool", "TrainingJob",
           "local_config", "training_session"]


def __getattr__(name: str) -> Any:
    """Load ``name`` from its submodule on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the lazily loaded ones included."""
    return sorted(set(globals()) | set(__all__))
