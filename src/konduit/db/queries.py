"""Load the named queries from the ``sql/`` folder.

Every runtime query lives in a ``.sql`` file under a ``-- name: entity_verb_guard`` header
followed by a one-line ``--`` description, so the SQL shipped is the SQL one can EXPLAIN.

Plans. psycopg prepares a statement on a connection once it has run a few times there, and
PostgreSQL then may keep one *generic* plan for it, built with the statistics of that moment.
A plan built while the tables were tiny (a fresh database, a worker that ran small executions
first) can stay in use after one execution grew to 10,000 rows: a join's upstream load went
from 0.03 s to 5.5 s that way (190x), and past 100 s at 10,000 items. So each statement says
which kind it is:

- by default a statement's cost is bounded by its own parameters (a primary-key or unique-key
  lookup, an ``unnest`` of ids joined on a key, a ``LIMIT`` over an index order): any plan of
  it reads what it returns, and it is prepared as usual;
- a statement whose cost grows with data of one execution or one step (the rows of a map, a
  step's history, a backlog) carries ``-- plan: custom`` among its description lines, with
  why. It is never prepared: each run is planned with its own parameters and the table sizes
  of that moment (an unnamed statement; PgBouncer-safe too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)
_PLAN = re.compile(r"^plan:\s*custom\b")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str
    custom_plan: bool = False
    """Plan each run with its own parameters (never prepared): see the module docstring."""


def parse_queries(text: str, source: str = "<sql>") -> dict[str, Query]:
    """Split a ``.sql`` file into its named queries."""
    found: dict[str, Query] = {}
    headers = list(_HEADER.finditer(text))
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        body = text[header.end() : end].strip().splitlines()
        description_lines = []
        custom_plan = False
        while body and body[0].startswith("--"):
            line = body.pop(0).lstrip("-").strip()
            if _PLAN.match(line):
                custom_plan = True
                line = line.removeprefix("plan:").strip().removeprefix("custom").strip(" ,:-")
            if line:
                description_lines.append(line)
        sql = "\n".join(body).strip().rstrip(";")
        name = header.group("name")
        if not description_lines or not sql:
            raise ValueError(f"{source}: query {name!r} needs a description line and a body")
        if name in found:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        found[name] = Query(name, " ".join(description_lines), sql, custom_plan)
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


def prepare_flag(name: str) -> bool | None:
    """psycopg's ``prepare=`` for the query called ``name``: False (never prepared) for a
    ``-- plan: custom`` statement, else None (prepared once it has run a few times)."""
    return False if all_queries()[name].custom_plan else None


def q(name: str) -> str:
    """The SQL text of the query called ``name``."""
    try:
        return all_queries()[name].sql
    except KeyError:
        raise KeyError(f"no query named {name!r} in konduit/db/sql") from None
