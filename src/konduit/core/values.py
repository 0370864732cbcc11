"""The checks of the plain values a caller hands the engine: text PostgreSQL can hold and whole
numbers within their column's range. A value that fails one is the caller's fault, refused
where it enters with a :class:`~konduit.KonduitError` naming its field, never sent to the
database to come back as a :class:`~konduit.DatabaseError` (which the HTTP API answers ``503
try again``: a client would retry it forever).

Pure: no database here.
"""

from __future__ import annotations

from typing import Any

from konduit.errors import KonduitError, blamed

MAX_INT = 2**31 - 1
"""The largest value of a PostgreSQL ``integer`` (a workflow version)."""
MAX_BIGINT = 2**63 - 1
"""The largest value of a PostgreSQL ``bigint`` (a task id, a row count)."""


def storable(text: str) -> bool:
    """Whether PostgreSQL can hold ``text``: no NUL character, and valid UTF-8 (no lone
    surrogate, which a Python string may hold, ``"\\ud800"`` read from JSON)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: Any, field: str, *, what: str | None = None) -> Any:
    """``value`` when it is None, or text PostgreSQL can hold; else a :class:`KonduitError`
    naming ``field`` (and ``what`` in its message, default the field). Other types are left to
    the checks that follow."""
    if isinstance(value, str) and not storable(value):
        raise blamed(KonduitError(
            f"{what or field} {value!r:.80}: text with a NUL character or a lone surrogate "
            f"cannot be stored"), field)
    return value


def check_whole(value: Any, field: str, *, low: int = 1, high: int = MAX_INT,
                what: str | None = None) -> int:
    """``value`` when it is a whole number from ``low`` to ``high``; else a
    :class:`KonduitError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise blamed(KonduitError(
            f"{what or field} {value!r:.40}: a whole number from {low} to {high}"), field)
    return value
