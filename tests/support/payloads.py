"""Payloads a test reads from the database itself, opened as Konduit opens them.

Under ``pytest --payload-codec`` every process seals payloads with the codec the environment
configures (KONDUIT_CODEC_KEYS, set for the run in tests/conftest.py): a test that SELECTs a
payload column on a connection of its own reads an envelope. Where the raw read is only the
way a test looks at a value (not what it checks), it opens the value here, with the same
codec; without a codec every value comes back as it was read.
"""

from __future__ import annotations

import json
from typing import Any

from konduit.core.payloads import MARK
from konduit.db.sealing import configured


def codec_on() -> bool:
    """Whether this run seals payloads with a codec (``--payload-codec``, or KONDUIT_CODEC...)."""
    return configured().codec is not None


def opened(value: Any) -> Any:
    """``value`` (a ``jsonb`` column as psycopg decodes it, or JSON text such as
    ``payload::text`` or ``payload #>> '{}'``) with every envelope in it opened."""
    if isinstance(value, dict | list):
        text = json.dumps(value)
        return configured().loads(text) if MARK in text else value
    if isinstance(value, str) and MARK in value:
        try:
            return configured().loads(value)
        except ValueError:  # text that only mentions the mark
            return value
    return value


def opened_rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each column of each row :func:`opened`."""
    return [tuple(opened(v) for v in row) for row in rows]
