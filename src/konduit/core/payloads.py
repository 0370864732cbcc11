"""JSON payloads: encoding with clear errors, size limits and content hashes."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from konduit.errors import PayloadError

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
# An escaped NUL in JSON text: "\u0000" preceded by an even number of backslashes.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def canonical_json(value: Any, *, what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Encode ``value`` as JSON, or raise :class:`PayloadError` naming ``what`` and the reason."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serializable: {exc}") from exc
    if _NUL.search(text):
        # JSON allows it, PostgreSQL's jsonb does not: refuse it here, with a reason, rather than
        # fail the transaction that records the outcome.
        raise PayloadError(f"{what} contains a NUL character (\\u0000), which PostgreSQL cannot store")
    size = len(text.encode())
    if size > max_bytes:
        raise PayloadError(f"{what} is {size} bytes, over the limit of {max_bytes} bytes")
    return text


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
