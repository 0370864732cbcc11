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

_PLAIN = (int, float, UUID)  # their text never holds a quote, a backslash or a comma


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
            return None
    if kind is None:
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    if kind is bool:
        parts = ["NULL" if v is None else ("t" if v else "f") for v in values]
    elif kind in _PLAIN:
        parts = ["NULL" if v is None else str(v) for v in values]
    elif kind is str:
        parts = ["NULL" if v is None else _quoted(v) for v in values]
    elif kind is datetime:
        parts = ["NULL" if v is None else f'"{v.isoformat()}"' for v in values]
    else:
        return None
    return "{" + ",".join(parts) + "}"


def with_array_literals(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with each list value that :func:`array_literal` can write replaced by it."""
    for key, value in params.items():
        if type(value) is list:
            literal = array_literal(value)
            if literal is not None:
                params[key] = literal
    return params
