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
  of that moment (an unnamed statement; PgBouncer-safe too);
- a statement that runs at every claim or round, where planning it each time costs too much
  (PostgreSQL re-plans a prepared statement whose kept plan it estimates dearer than its
  custom ones: those taking arrays, most of the round's), carries ``-- plan: pinned``: in a
  transaction :class:`konduit.db.database.Tx` sends ``task_claim_plan_pinned`` before the first
  of them, which restricts the planner to index paths and nested loops (no JIT) for the rest of
  the transaction and makes a prepared statement run its kept plan. That plan is made under
  those settings, so it reads indexes in order and looks rows up by key whatever the table
  sizes were when it was made (a pinned statement must be written so that such a plan exists:
  tests/test_plan_stability.py checks the claim's on a backlog grown after the plan was made).
  A ``-- plan: custom`` statement later in the transaction first gets the session's settings
  back (``task_claim_plan_unpinned``); outside a transaction a pinned statement is planned per
  run, never prepared.

Sealed texts. A statement that writes an error text or a message that may carry payload data
(a handler's exception and traceback, a trigger's error) into a ``text`` column names those
parameters on a ``-- sealed: error, errors`` line among its description lines: under an
encrypting codec each such value (or each item of a list) is stored as the JSON text of an
envelope, and read back opened (:meth:`konduit.db.sealing.PayloadIO.seal_text`), wherever
the text was written from.

Fragments. A piece of SQL several statements must write alike (the columns a claimed task row
carries, the SET list that clears a lease) stands once, under a ``-- fragment: noun_words``
header with its ``--`` description, in any ``.sql`` file. A statement names it as
``{{noun_words}}`` and it is expanded when the queries load: ``q(name)`` returns the whole
statement, as sent to the server and as one EXPLAINs it. The lines of a fragment after the
first are indented to the column of its ``{{``, so the expanded statement reads as written.
A fragment may include others (never itself, even through another), and every fragment is
used (tests/test_queries_fitness.py).
Guards (a WHERE condition several statements re-check) are not fragments but inlinable SQL
functions (migration 0020_lease_guards.sql), so each statement still says what it checks.

The history. A read of one execution's own rows reads them through
``konduit_<table>_of(execution)`` (migration 0047): the hot table and the history's days from
the one before the execution's id was made. A read of an execution's parent, children or forks
reads
``konduit_<table>_since(konduit_history_from(id))``. Both prune the history's days when the
statement is planned; the ``konduit_<table>_all`` views, which plan every day, are for reads
that know no execution (an id's start or tail).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- (?P<kind>name|fragment): (?P<name>[a-z_]+)\s*$", re.MULTILINE)
_PLAN = re.compile(r"^plan:\s*(?P<kind>custom|pinned)\b")
_SEALED = re.compile(r"^sealed:\s*(?P<names>[a-z_]+(?:\s*,\s*[a-z_]+)*)\s*$")
_INCLUDE = re.compile(r"\{\{(?P<name>[a-z_]+)\}\}")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str
    custom_plan: bool = False
    """Plan each run with its own parameters (never prepared): see the module docstring."""
    fragments: frozenset[str] = frozenset()
    """The fragments its text includes."""
    pinned_plan: bool = False
    """Prepared, run after ``task_claim_plan_pinned`` in its transaction: see the module
    docstring."""
    sealed_texts: frozenset[str] = frozenset()
    """The parameters that are error texts or messages, sealed with the codec as texts (a
    ``-- sealed: error, errors`` line): see the module docstring."""


def _sections(text: str) -> Iterator[tuple[str, str, str]]:
    """(kind, name, body) of each ``-- name:`` or ``-- fragment:`` section of a file."""
    headers = list(_HEADER.finditer(text))
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        yield header.group("kind"), header.group("name"), text[header.end() : end]


def parse_fragments(text: str, source: str = "<sql>") -> dict[str, str]:
    """The fragments a ``.sql`` file defines: name -> SQL (without its description)."""
    found: dict[str, str] = {}
    for kind, name, body in _sections(text):
        if kind != "fragment":
            continue
        lines = body.strip().splitlines()
        described = bool(lines) and lines[0].startswith("--")
        while lines and lines[0].startswith("--"):
            lines.pop(0)
        sql = "\n".join(lines).strip().rstrip(";")
        if not described or not sql:
            raise ValueError(f"{source}: fragment {name!r} needs a description line and a body")
        if name in found:
            raise ValueError(f"{source}: fragment {name!r} is defined twice")
        found[name] = sql
    return found


def expand(sql: str, fragments: Mapping[str, str], source: str = "<sql>",
           within: tuple[str, ...] = ()) -> str:
    """``sql`` with each ``{{fragment}}`` replaced by its (expanded) text, its later lines
    indented to the include's column; ``within``: the fragments being expanded around it."""

    def include(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in fragments:
            raise ValueError(f"{source}: no fragment named {name!r}")
        if name in within:
            raise ValueError(f"{source}: fragment {name!r} includes itself")
        column = match.start() - (sql.rfind("\n", 0, match.start()) + 1)
        text = expand(fragments[name], fragments, source, (*within, name))
        return ("\n" + " " * column).join(text.splitlines())

    return _INCLUDE.sub(include, sql)


def parse_queries(text: str, source: str = "<sql>",
                  fragments: Mapping[str, str] | None = None) -> dict[str, Query]:
    """Split a ``.sql`` file into its named queries, its fragments (and ``fragments``, those of
    the other files) expanded."""
    known = {**(fragments or {}), **parse_fragments(text, source)}
    found: dict[str, Query] = {}
    for kind, name, section in _sections(text):
        if kind != "name":
            continue
        body = section.strip().splitlines()
        description_lines = []
        custom_plan = pinned_plan = False
        sealed: frozenset[str] = frozenset()
        while body and body[0].startswith("--"):
            line = body.pop(0).lstrip("-").strip()
            texts = _SEALED.match(line)
            if texts:
                sealed = sealed | {n.strip() for n in texts["names"].split(",")}
                continue
            plan = _PLAN.match(line)
            if plan:
                custom_plan = plan["kind"] == "custom"
                pinned_plan = plan["kind"] == "pinned"
                line = line.removeprefix("plan:").strip().removeprefix(plan["kind"]).strip(" ,:-")
            if line:
                description_lines.append(line)
        written = "\n".join(body).strip().rstrip(";")
        sql = expand(written, known, source)
        if not description_lines or not sql:
            raise ValueError(f"{source}: query {name!r} needs a description line and a body")
        if name in found:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        found[name] = Query(name, " ".join(description_lines), sql, custom_plan,
                            frozenset(_INCLUDE.findall(written)), pinned_plan, sealed)
    return found


def _sql_files() -> list[tuple[str, str]]:
    folder = resources.files("konduit.db") / "sql"
    return [(entry.name, entry.read_text())
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".sql")]


@cache
def all_fragments() -> dict[str, str]:
    fragments: dict[str, str] = {}
    for source, text in _sql_files():
        for name, sql in parse_fragments(text, source).items():
            if name in fragments:
                raise ValueError(f"fragment {name!r} is defined in two files")
            fragments[name] = sql
    return fragments


@cache
def all_queries() -> dict[str, Query]:
    queries: dict[str, Query] = {}
    for source, text in _sql_files():
        for name, query in parse_queries(text, source, all_fragments()).items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined in two files")
            queries[name] = query
    return queries


def prepare_flag(name: str) -> bool | None:
    """psycopg's ``prepare=`` for the query called ``name``: False (never prepared) for a
    ``-- plan: custom`` statement, else None (prepared once it has run a few times)."""
    return False if all_queries()[name].custom_plan else None




@cache
def pinned_plans() -> frozenset[str]:
    """The names of the ``-- plan: pinned`` statements."""
    return frozenset(n for n, query in all_queries().items() if query.pinned_plan)


@cache
def custom_plans() -> frozenset[str]:
    """The names of the ``-- plan: custom`` statements."""
    return frozenset(n for n, query in all_queries().items() if query.custom_plan)


@cache
def sealed_texts(name: str) -> frozenset[str]:
    """The parameters of the query called ``name`` sealed as texts (``-- sealed:``)."""
    return all_queries()[name].sealed_texts


_STATEMENTS: dict[str, tuple[str, bool | None]] = {}


def statement(name: str) -> tuple[str, bool | None]:
    """The SQL text of the query called ``name`` and its :func:`prepare_flag`, looked up once:
    every statement a worker runs asks for both."""
    try:
        return _STATEMENTS[name]
    except KeyError:
        found = _STATEMENTS[name] = (q(name), prepare_flag(name))
        return found


def q(name: str) -> str:
    """The SQL text of the query called ``name``."""
    try:
        return all_queries()[name].sql
    except KeyError:
        raise KeyError(f"no query named {name!r} in konduit/db/sql") from None
