"""Execution ids that sort by creation time (UUID version 7, RFC 9562).

The claim orders ready tasks by their execution's id within a priority, so a backlog drains
execution by execution — the oldest execution's downstream tasks before new executions' roots —
and the index that serves the claim needs no second timestamp column.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from uuid import UUID

_lock = threading.Lock()
_last = 0


def uuid7() -> UUID:
    """A version-7 UUID: 48 bits of Unix milliseconds, then random bits. Ids made by one process
    are strictly increasing even within a millisecond (the counter carries into the timestamp)."""
    global _last
    with _lock:
        now = time.time_ns() // 1_000_000
        # 12 bits of sub-millisecond sequence in rand_a keep ids of one process ordered.
        stamp = max(now << 12, _last + 1)
        _last = stamp
    millis, sequence = stamp >> 12, stamp & 0xFFF
    tail = int.from_bytes(os.urandom(8), "big") & 0x3FFF_FFFF_FFFF_FFFF  # 62 random bits
    value = (millis & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | sequence << 64 | 0b10 << 62 | tail
    return UUID(int=value)


SHORT_LENGTH = 12
"""Hex characters of an id shown shortened: its last group, the random tail. A UUIDv7's first
characters are its millisecond timestamp and read the same for every execution of a minute."""


def short_id(value: UUID | str) -> str:
    """The random tail of an execution id (its last 12 hex characters, the text after its last
    dash), the part that tells two executions of the same minute apart. Any face that shows an
    id shortened shows this; :func:`id_pattern` and ``Client.resolve`` accept it back."""
    text = str(value).strip().lower()
    return text[-SHORT_LENGTH:]


@dataclass(frozen=True)
class IdPattern:
    """What a typed id can match: a full id, or a unique prefix or tail of one."""

    full: UUID | None  # the whole id, when the text is one
    hex: str  # the text's hex digits, dashes dropped (lowercase)
    text: str  # the text, lowercase


MIN_PIECE = 4
"""The fewest hex digits a prefix or tail may have (fewer match too much to be meant)."""


def id_pattern(text: str) -> IdPattern:
    """Parse what someone typed for an execution id. Raises :class:`ValueError` saying what is
    wrong when it cannot be an id or a piece of one (not hex, too short, too long)."""
    # The tail as a page shows it ("…1a2b3c4d5e6f") may be pasted with its ellipsis.
    cleaned = str(text).strip().lower().lstrip("…. ")
    try:
        return IdPattern(UUID(cleaned), UUID(cleaned).hex, cleaned)
    except ValueError:
        pass
    digits = cleaned.replace("-", "")
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"{text!r} is not an execution id nor a piece of one (hex digits "
                         "and dashes)")
    if len(digits) < MIN_PIECE:
        raise ValueError(f"{text!r} is too short to name an execution: give at least "
                         f"{MIN_PIECE} hex digits of its id (its start or its end)")
    if len(digits) >= 32:
        raise ValueError(f"{text!r} is not an execution id (32 hex digits, or a piece of them)")
    return IdPattern(None, digits, cleaned)


def matches(pattern: IdPattern, candidate: UUID) -> bool:
    """Whether ``candidate`` starts or ends with the typed piece (dashes ignored)."""
    if pattern.full is not None:
        return candidate == pattern.full
    digits = candidate.hex
    return digits.startswith(pattern.hex) or digits.endswith(pattern.hex)


def prefix_range(pattern: IdPattern) -> tuple[UUID, UUID]:
    """The smallest and largest ids that start with the typed hex digits (an index range)."""
    pad = 32 - len(pattern.hex)
    return UUID(hex=pattern.hex + "0" * pad), UUID(hex=pattern.hex + "f" * pad)
