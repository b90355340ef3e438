"""Remote submission through Globus Compute: a whole training run started, watched and collected from a laptop.

``parsl_bft.remote.facility`` runs at the facility (inside short Globus Compute tasks), ``runner`` is the
detached session it starts there, ``client`` and ``bundle`` are the laptop's side. See docs/globus-compute.md.
"""
from .client import (EndpointUnavailable, NotLoggedIn, RemoteError, RemoteJobFailed, RemoteRun, RemoteSession,
                     remote_session)

__all__ = ["EndpointUnavailable", "NotLoggedIn", "RemoteError", "RemoteJobFailed", "RemoteRun", "RemoteSession",
           "remote_session"]
