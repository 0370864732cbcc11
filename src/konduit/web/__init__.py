"""The web dashboard (``konduit dashboard``); see :mod:`konduit.web.app`."""

from konduit.web.app import create_app, database_client, serve

__all__ = ["create_app", "database_client", "serve"]
