"""Remote submission through Globus Compute: a whole training run started, watched and collected from a laptop.

``parsl_bft.remote.facility`` runs at the facility (inside short Globus Compute tasks), ``runner`` is the
detached session it starts there, ``client`` and ``bundle`` are the laptop's side, ``commands`` the CLI. See
docs/tutorials/from-a-laptop.md.
"""
__all__ = ["EndpointUnavailable", "NotLoggedIn", "RemoteError", "RemoteJobFailed", "RemoteRun", "RemoteSession",
           "remote_session"]


def __getattr__(name: str):
    """The client on first use: the CLI imports this package for its parsers, which need none of it."""
    if name in __all__:
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
