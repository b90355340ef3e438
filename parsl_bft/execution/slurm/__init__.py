"""Slurm back end: the command seam and the pilot-job provider."""
from .commands import JobRecord, NodeRecord, SlurmCommands, SlurmError
from .provider import SlurmPilotProvider

__all__ = ["JobRecord", "NodeRecord", "SlurmCommands", "SlurmError", "SlurmPilotProvider"]
