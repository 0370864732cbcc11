"""Load the named queries from the ``sql/`` folder.

Every runtime query lives in a ``.sql`` file under a ``-- name: entity_verb_guard`` header
followed by a one-line ``--`` description, so the SQL shipped is the SQL one can EXPLAIN.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str


def parse_queries(text: str, source: str = "<sql>") -> dict[str, Query]:
    """Split a ``.sql`` file into its named queries."""
    found: dict[str, Query] = {}
    headers = list(_HEADER.finditer(text))
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        body = text[header.end() : end].strip().splitlines()
        description_lines = []
        while body and body[0].startswith("--"):
            description_lines.append(body.pop(0).lstrip("-").strip())
        sql = "\n".join(body).strip().rstrip(";")
        name = header.group("name")
        if not description_lines or not sql:
            raise ValueError(f"{source}: query {name!r} needs a description line and a body")
        if name in found:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        found[name] = Query(name, " ".join(description_lines), sql)
    return found


@cache
def all_queries() -> dict[str, Query]:
    queries: dict[str, Query] = {}
    folder = resources.files("konduit.db") / "sql"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, query in parse_queries(entry.read_text(), entry.name).items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined in two files")
            queries[name] = query
    return queries


def q(name: str) -> str:
    """The SQL text of the query called ``name``."""
    try:
        return all_queries()[name].sql
    except KeyError:
        raise KeyError(f"no query named {name!r} in konduit/db/sql") from None
