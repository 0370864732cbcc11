"""Execution ids that sort by creation time (UUID version 7, RFC 9562).

The claim orders ready tasks by their execution's id within a priority, so a backlog drains
execution by execution — the oldest execution's downstream tasks before new executions' roots —
and the index that serves the claim needs no second timestamp column.
"""

from __future__ import annotations

import os
import threading
import time
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
