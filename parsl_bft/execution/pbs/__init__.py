"""PBS Pro back end: the command seam (JSON output), hole discovery and the pilot-job provider."""
from .commands import PBSCommands, PBSJob, PBSNode
from .provider import PBSPilotProvider, find_holes

__all__ = ["PBSCommands", "PBSJob", "PBSNode", "PBSPilotProvider", "find_holes"]
