"""PBS Pro back end: the command seam (JSON output) and the pilot-job provider."""
from .commands import PBSCommands, PBSJob, PBSNode
from .provider import PBSPilotProvider

__all__ = ["PBSCommands", "PBSJob", "PBSNode", "PBSPilotProvider"]
