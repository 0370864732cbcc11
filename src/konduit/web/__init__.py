"""The web dashboard (``konduit dashboard``); see :mod:`konduit.web.app`. Needs the ``web``
extra (``pip install 'konduit-pg[web]'``)."""

from konduit.extras import require

require("web", "konduit.web (the dashboard and the HTTP API)")

from konduit.web.app import create_app, database_client, serve  # noqa: E402
from konduit.web.security import Security, Token, parse_tokens  # noqa: E402

__all__ = ["Security", "Token", "create_app", "database_client", "parse_tokens", "serve"]
