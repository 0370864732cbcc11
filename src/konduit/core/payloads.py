"""JSON payloads: encoding with clear errors, size and depth limits, and content hashes.

Every payload the engine stores (an execution's input, a step's output, a map item) goes
through :func:`canonical_json`, so a value PostgreSQL or a worker could not handle is refused
where it enters, with a :class:`~konduit.PayloadError` naming it, never later as a bare
``RecursionError`` or a failed transaction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from itertools import accumulate
from typing import Any

from konduit.errors import PayloadError, PayloadTooLarge

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""The default size limit of one payload's JSON text (``App(payload_limit=)``)."""
DEFAULT_WARN_BYTES = 1024 * 1024
"""Payloads larger than this are logged as a warning (``App(payload_warn=)``)."""
warn_bytes = DEFAULT_WARN_BYTES
"""The process's warning size (set by ``App(payload_warn=)``, ``KONDUIT_PAYLOAD_WARN``)."""
log = logging.getLogger("konduit.payloads")
MARK = "$konduit"
"""The key of an envelope: a payload as a codec or a store left it in the database."""


class Payload(str):
    """The JSON text of a payload, as :func:`canonical_json` made it: a ``str`` that the
    database boundary (:class:`konduit.db.database.Tx`) seals with the configured codec, and
    moves to the payload store when it is large, on its way in. ``what`` names it."""

    __slots__ = ()


class Digest(str):
    """A payload's plain SHA-256 (:func:`content_hash`): the database boundary stores it keyed
    (HMAC) when the codec encrypts, so the hash does not tell which payloads are equal."""

    __slots__ = ()


def is_sealed(value: Any) -> bool:
    """Whether ``value`` is an envelope this process could not open (a codec's or a store's)."""
    return type(value) is dict and MARK in value and value[MARK] in ("sealed", "stored")
MAX_DEPTH = 512
"""Deepest nesting of arrays and objects a payload may have. PostgreSQL's jsonb has no fixed
limit (its parser stops at ``max_stack_depth``, some 10,000+ levels by default), but Python's
``json`` gives up near ``sys.getrecursionlimit()`` (1,000) less the stack already in use: a
worker must be able to decode every payload it is handed, from inside its own call stack."""

# An escaped NUL in JSON text: "\u0000" preceded by an even number of backslashes.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Everything but brackets and quotes, deleted by str.translate (json.dumps output is ASCII).
_NOT_STRUCTURE = {c: None for c in range(128) if chr(c) not in '[]{}"'}
_SQUARE = str.maketrans("{}", "[]")
_QUOTED = re.compile(r'"[^"]*"')
_BRACKET_STEP = {"[": 1, "]": -1}
# Escapes, consumed left to right so that "\\" never starts another escape.
_ESCAPE = re.compile(r"\\(?:u(d[89a-f][0-9a-f]{2})|.)")


def json_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in a JSON text, computed with string operations
    that run in C (a walk of a large payload in Python would cost more than encoding it)."""
    if "\\" in text:
        # Drop escaped backslashes, then escaped quotes: every quote left delimits a string.
        text = text.replace("\\\\", "").replace('\\"', "")
    # A bracket is inside a string when an odd number of quotes precede it, so dropping two
    # adjacent quotes changes nothing; whatever quotes remain enclose brackets of strings.
    shape = text.translate(_NOT_STRUCTURE).replace('""', "")
    if '"' in shape:
        shape = _QUOTED.sub("", shape)
    shape = shape.translate(_SQUARE)
    # Peel the innermost containers a few times (each pass is one fast scan; most payloads
    # are shallow and end here), then count what is left the slow way.
    depth = 0
    while shape and depth < 8:
        shape = shape.replace("[]", "")
        depth += 1
    if not shape:
        return depth
    return depth + max(accumulate(map(_BRACKET_STEP.__getitem__, shape)))


def _too_deep(text: str, limit: int) -> bool:
    if text.count("[") + text.count("{") <= limit:
        return False  # fewer containers than the limit cannot nest deeper: the common case
    return json_depth(text) > limit


def _lone_surrogate(text: str) -> bool:
    """True when the JSON text has a UTF-16 surrogate escape that is not part of a pair (a
    Python string may hold one; PostgreSQL's jsonb refuses it)."""
    if "\\ud" not in text:
        return False
    pending_high = -1  # end offset of a high surrogate escape waiting for its low half
    for m in _ESCAPE.finditer(text):
        code = m.group(1)
        low = code is not None and code[1] in "cdef"
        if pending_high >= 0:
            if not (low and m.start() == pending_high):
                return True
            pending_high = -1
            continue
        if code is None:
            continue
        if low:
            return True
        pending_high = m.end()
    return pending_high >= 0


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
"""What ``json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)`` builds on
every call (an encoder with those options), built once: every output is encoded here. It keeps
no state between calls."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024, "m": 1000**2,
          "mb": 1000**2, "mib": 1024**2, "mi": 1024**2, "g": 1000**3, "gb": 1000**3,
          "gib": 1024**3, "gi": 1024**3}


def parse_size(value: Any, *, what: str = "size") -> int:
    """Bytes from a whole number or text such as ``"10MB"``, ``"512KiB"``, ``"1.5GB"``; a
    :class:`~konduit.KonduitError` naming ``what`` otherwise."""
    from konduit.errors import KonduitError

    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise KonduitError(f"{what}={value!r}: a size of 1 byte or more")
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None:
        raise KonduitError(f"{what}={value!r:.40}: a size in bytes, or with a unit (10MB, "
                           f"512KiB, 1GB)")
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if size < 1:
        raise KonduitError(f"{what}={value!r}: a size of 1 byte or more")
    return size


def _step_of(what: str) -> str | None:
    m = re.match(r"output of step '([^']*)'", what)
    return m.group(1) if m else None


def canonical_json(
    value: Any, *, what: str, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Payload:
    """Encode ``value`` as JSON, or raise :class:`PayloadError` naming ``what`` and the reason
    (not JSON, a NUL character, an unpaired surrogate, deeper than ``max_depth`` levels of
    arrays and objects, or :class:`PayloadTooLarge`, over ``max_bytes``).

    The text is a :class:`Payload`: handed to a statement as a parameter, it is sealed with the
    configured codec on its way into the database."""
    try:
        text = _CANONICAL.encode(value)
    except RecursionError:
        raise PayloadError(
            f"{what} is nested deeper than the limit of {max_depth} levels of arrays and objects"
        ) from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serializable: {exc}") from exc
    size = len(text)  # json.dumps escapes non-ASCII: one byte per character
    if size > max_bytes:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the limit of {max_bytes} "
            f"bytes: return a reference to the data instead, or configure a payload store "
            f"(docs/payload-codecs.md)", what=what, size=size, limit=max_bytes,
            step=_step_of(what))
    if size > warn_bytes:
        log.warning("%s is %s bytes (%.1f MB), over the warning size of %s bytes (the limit is "
                    "%s)", what, f"{size:,}", size / 1e6, f"{warn_bytes:,}", f"{max_bytes:,}")
    if _too_deep(text, max_depth):
        raise PayloadError(
            f"{what} is nested deeper than the limit of {max_depth} levels of arrays and objects"
        )
    if _NUL.search(text):
        # JSON allows it, PostgreSQL's jsonb does not: refuse it here, with a reason, rather than
        # fail the transaction that records the outcome.
        raise PayloadError(f"{what} contains a NUL character (\\u0000), which PostgreSQL cannot store")
    if _lone_surrogate(text):
        raise PayloadError(
            f"{what} contains an unpaired UTF-16 surrogate (a string such as '\\ud800'), "
            "which PostgreSQL cannot store"
        )
    return Payload(text)


def content_hash(text: str) -> Digest:
    """The SHA-256 of a payload's text, as a :class:`Digest` (keyed at the database boundary
    when the codec encrypts)."""
    return Digest(hashlib.sha256(text.encode()).hexdigest())
