"""Array parameters as PostgreSQL array literals, built in one pass.

The set-based statements of the hot path (a round of outcomes, a claim's lease check, a start)
pass their rows as parallel arrays and ``unnest`` them. psycopg dumps a Python list element by
element in Python: it inspects the elements to pick the array type, then escapes each one
through a regular expression; that was a sixth of a worker's time. The statements cast every
array parameter (``%(ids)s::bigint[]``), so an array literal in a plain string serves as well:
the server parses it with the array type's own input function.

Every element is quoted (the one quoting rule that is always right: a backslash before ``\\``
and ``"``); None is NULL. Lists whose elements are not all of one supported type are left to
psycopg, unchanged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

_PLAIN = (int, float)  # their text never holds a quote, a backslash or a comma

_UUID_TEXT: dict[UUID, str] = {}
"""The text of UUIDs met lately. ``UUID.__str__`` is Python code (a formatting and five slices);
the same execution ids and lease tokens come back in statement after statement (a claim, its
lease check, the round that ends the tasks), so most are looked up, not formatted."""
_UUID_TEXT_MAX = 20_000


def _uuid_text(value: UUID) -> str:
    text = str(value)
    if len(_UUID_TEXT) >= _UUID_TEXT_MAX:
        _UUID_TEXT.clear()
    _UUID_TEXT[value] = text
    return text


def _quoted(text: str) -> str:
    if "\\" in text or '"' in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def array_literal(values: list[Any]) -> str | None:
    """The PostgreSQL array literal of ``values``, or None to let the driver dump them."""
    kind: type | None = None
    for value in values:
        if value is None:
            continue
        if kind is None:
            kind = type(value)
        elif type(value) is not kind:
            # Strings of several kinds (a row's plain status beside a StrEnum member) are
            # strings all the same; any other mix is the driver's.
            if not (isinstance(value, str) and issubclass(kind, str)):
                return None
            kind = _MixedStr
    if kind is None:
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    if kind is bool:
        parts = ["NULL" if v is None else ("t" if v else "f") for v in values]
    elif kind is str:
        parts = ["NULL" if v is None else _quoted(v) for v in values]
    elif kind is UUID:
        texts = _UUID_TEXT
        parts = ["NULL" if v is None else texts.get(v) or _uuid_text(v) for v in values]
    elif kind in _PLAIN:
        parts = ["NULL" if v is None else str(v) for v in values]
    elif issubclass(kind, str):
        # StrEnum members (statuses, outcomes, sources) and other str subclasses: their value,
        # as ``str.__str__`` gives it whatever the subclass's own ``__str__`` or ``__format__``.
        parts = ["NULL" if v is None else _quoted(str.__str__(v)) for v in values]
    elif kind is datetime:
        parts = ["NULL" if v is None else f'"{v.isoformat()}"' for v in values]
    else:
        return None
    return "{" + ",".join(parts) + "}"


class _MixedStr(str):
    """Marks a list of strings of more than one class (never instantiated)."""


def with_array_literals(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with each list value that :func:`array_literal` can write replaced by it."""
    for key, value in params.items():
        if type(value) is list:
            literal = array_literal(value)
            if literal is not None:
                params[key] = literal
    return params
