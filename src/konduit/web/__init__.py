"""The web dashboard (``konduit dashboard``); see :mod:`konduit.web.app`."""

from konduit.web.app import create_app, database_client, serve
from konduit.web.security import Security, Token, parse_tokens

__all__ = ["Security", "Token", "create_app", "database_client", "parse_tokens", "serve"]
