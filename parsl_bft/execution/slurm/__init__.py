"""Slurm back end: the command seam, hole discovery and the pilot-job provider."""
from .commands import JobRecord, NodeRecord, PendingRecord, SlurmCommands, SlurmError
from ..pilot import Hole
from .provider import SlurmPilotProvider, find_holes

__all__ = ["JobRecord", "NodeRecord", "PendingRecord", "SlurmCommands", "SlurmError", "Hole",
           "SlurmPilotProvider", "find_holes"]
