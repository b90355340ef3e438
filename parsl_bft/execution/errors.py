"""The runtime's errors: everything the orchestrator raises on purpose is a ``ParslBftError``."""
from __future__ import annotations

from ..errors import ParslBftError


class StateError(ParslBftError):
    """An orchestrator state directory that cannot be used (damaged database, held by another orchestrator)."""


class StateLocked(StateError):
    """Another orchestrator holds this state directory."""


class JobFailed(ParslBftError):
    """A job whose own fragments failed ``max_failures`` times in a row (not reclaims) without saving progress."""


class RunStopped(ParslBftError):
    """The run stopped (stop(), the session ended, a signal) before this job was done."""
