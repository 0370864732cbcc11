"""Mask the password of a database URL or connection string in any text (messages, logs,
error pages): drivers echo the whole URL when they cannot parse it.

On the bottom floor beside :mod:`konduit.errors`, whose database errors it masks: it imports
nothing of konduit."""

from __future__ import annotations

import re

# user:password@ in a URL, and password=... in a key/value connection string.
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s\"']*:)[^@\s\"']*@", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s\"]+)", re.IGNORECASE)


def mask_password(text: str) -> str:
    """``text`` with any database URL's or connection string's password replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***@", text)
    return _KV_PASSWORD.sub(lambda m: m.group("head") + "***", text)
