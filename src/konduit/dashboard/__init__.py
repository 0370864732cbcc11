"""The web dashboard (``konduit dashboard``); see :mod:`konduit.dashboard.app`."""

from konduit.dashboard.app import create_app, database_client, serve

__all__ = ["create_app", "database_client", "serve"]
