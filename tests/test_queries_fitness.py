"""Fitness of the named queries: every statement in konduit/db/sql is called from ``src/``,
every call names a statement that exists with exactly the parameters it binds, every fragment
is included somewhere, and every statement that includes the claimed-row projection returns
each column :meth:`TaskAttempt.from_row` reads.

Calls are found in the source with :mod:`ast`: ``x.one("name", a=...)`` and its siblings (the
methods of :class:`konduit.db.database.Tx` and ``Database`` that take a query name first).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import psycopg
import pytest

import konduit
from konduit.core.model import TaskAttempt
from konduit.db.queries import all_fragments, all_queries, parse_queries
from konduit.engine.deadlines import cut_columns
from konduit.engine.starts import TEMPLATE_COLUMNS, _traces
from konduit.engine.step_rows import state_columns, step_write_columns
from konduit.engine.transitions import claim_params
from tests.test_storage import _positional

# The Tx / Database methods whose first argument is a query name.
QUERY_METHODS = {"one", "all", "run", "send", "later", "stream"}
# Keywords of those methods that are not bind parameters.
NOT_PARAMETERS = {"page_rows"}
QUERY_NAME = re.compile(r"^[a-z]+(?:_[a-z]+)+$")
PARAMETER = re.compile(r"%\(([a-z_0-9]+)\)s")
# A receiver that holds a connection: tx, db, self.tx, self._db, main.db, self.reads ...
DATABASE_RECEIVER = re.compile(r"(?:^|\.)_?(?:tx|db|reads)$")

# Helpers whose dict a call spreads (``**cut_columns(found)``): the keys they produce, read
# from the helpers themselves so this list cannot drift from them.
SPREAD_KEYS: dict[str, Callable[[], set[str]]] = {
    "cut_columns": lambda: set(cut_columns([])),
    "state_columns": lambda: set(state_columns([])),
    "_traces": lambda: set(_traces([])),
    "template_for": lambda: {f"template_{c}" for c in TEMPLATE_COLUMNS},
    "claim_params": lambda: set(claim_params([], [], 0, 0.0, "")),
    "step_write_columns": lambda: set(step_write_columns([])),
}


def _parameters(sql: str) -> set[str]:
    return set(PARAMETER.findall(sql))


def _enclosing_functions(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Each node -> the innermost function (or the module) around it."""
    owner: dict[ast.AST, ast.AST] = {}

    def visit(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            owner[child] = scope
            is_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, child if is_function else scope)

    visit(tree, tree)
    return owner


def _arguments(scope: ast.AST, owner: Mapping[ast.AST, ast.AST]) -> set[str]:
    """The parameter names of ``scope`` and of the functions around it."""
    names: set[str] = set()
    while isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        names |= {a.arg for a in scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs}
        scope = owner[scope]
    return names


def _spread_keys(value: ast.expr, scope: ast.AST, owner: Mapping[ast.AST, ast.AST],
                 spreads: Mapping[str, Callable[[], set[str]]]) -> set[str] | None:
    """The keys of ``**value``: a dict literal bound to a name in the function around it (or,
    for a parameter, at each of the module's calls of that function), or the dict of a helper
    named in ``spreads``; None when they cannot be told."""
    if isinstance(value, ast.Await):
        value = value.value
    if isinstance(value, ast.Dict):
        keys = [k.value if isinstance(k, ast.Constant) else None for k in value.keys]
        strings = {k for k in keys if isinstance(k, str)}
        return strings if len(strings) == len(keys) else None
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else None
        return spreads[name]() if name in spreads else None
    if not isinstance(value, ast.Name):
        return None
    while True:
        for node in ast.walk(scope):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
            if any(isinstance(t, ast.Name) and t.id == value.id for t in targets):
                assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
                return _spread_keys(node.value, scope, owner, spreads)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            return _passed_keys(scope, value.id, owner, spreads)
        if not isinstance(scope, ast.Lambda):
            return None
        scope = owner[scope]


def _passed_keys(function: ast.FunctionDef | ast.AsyncFunctionDef, parameter: str,
                 owner: Mapping[ast.AST, ast.AST],
                 spreads: Mapping[str, Callable[[], set[str]]]) -> set[str] | None:
    """The keys of the dict every call of ``function`` in its module passes as ``parameter``."""
    positional = [a.arg for a in function.args.posonlyargs + function.args.args]
    module = function
    while module in owner:
        module = owner[module]
    found: list[set[str] | None] = []
    for call in ast.walk(module):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == function.name):
            continue
        passed = [k.value for k in call.keywords if k.arg == parameter]
        if parameter in positional and positional.index(parameter) < len(call.args):
            passed.append(call.args[positional.index(parameter)])
        found.extend(_spread_keys(p, owner[call], owner, spreads) for p in passed)
    if not found or any(keys is None or keys != found[0] for keys in found):
        return None
    return found[0]


def problems(queries: Mapping[str, str], modules: Mapping[str, str],
             spreads: Mapping[str, Callable[[], set[str]]] = SPREAD_KEYS) -> list[str]:
    """What is wrong between ``queries`` (name -> SQL) and the calls in ``modules`` (path ->
    Python source): calls of unknown queries, parameters a call misses or adds, queries no
    call names. A call whose query name is a variable may name any query its module lists as
    a string (``outputs_query`` returns one of two), and must fit each of them."""
    found: list[str] = []
    called: set[str] = set()
    # The query names each function of any module returns or lists (``outputs_query`` in
    # engine/outputs.py is called from engine/maps.py too).
    listing: dict[str, set[str]] = {}
    for source in modules.values():
        for fn in ast.walk(ast.parse(source)):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                listing.setdefault(fn.name, set()).update(
                    n.value for n in ast.walk(fn)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in queries)
    for path, source in modules.items():
        tree = ast.parse(source)
        owner = _enclosing_functions(tree)
        calls = [node for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr in QUERY_METHODS and node.args]
        # Names the module's calls spell out, and the other names it lists (returns, compares).
        named = {c.args[0].value for c in calls
                 if isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)}
        listed = {n.value for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in queries}
        for node in calls:
            where = f"{path}:{node.lineno}"
            first = node.args[0]
            scope = owner[node]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if not QUERY_NAME.match(first.value):
                    continue  # SQL text (a benchmark's probe), not a query name
                names = {first.value}
            elif not DATABASE_RECEIVER.search(ast.unparse(node.func.value)):
                continue  # asyncio.run(coro) and the like
            elif isinstance(first, ast.Name) and first.id in _arguments(scope, owner):
                continue  # a wrapper passing its caller's query on (Database.one -> Tx.one)
            elif (isinstance(first, ast.Call) and isinstance(first.func, ast.Name)
                  and listing.get(first.func.id)):
                names = listing[first.func.id]
            else:
                names = listed - named
                if not names:
                    found.append(f"{where}: the query name {ast.unparse(first)} is none its "
                                 f"module lists")
                    continue
            keywords = {k.arg for k in node.keywords if k.arg is not None} - NOT_PARAMETERS
            for spread in (k.value for k in node.keywords if k.arg is None):
                keys = _spread_keys(spread, scope, owner, spreads)
                if keys is None:
                    found.append(f"{where}: cannot tell the parameters in **{ast.unparse(spread)}")
                    break
                keywords |= keys
            else:
                for name in sorted(names):
                    called.add(name)
                    if name not in queries:
                        found.append(f"{where}: no query named {name!r}")
                        continue
                    wanted = _parameters(queries[name])
                    if keywords != wanted:
                        found.append(f"{where}: {name} binds {sorted(wanted)}; the call passes "
                                     f"{sorted(keywords)} (missing {sorted(wanted - keywords)}, "
                                     f"unknown {sorted(keywords - wanted)})")
    found.extend(f"query {name!r} is called nowhere" for name in sorted(set(queries) - called))
    return found


def _source_modules() -> dict[str, str]:
    root = Path(konduit.__file__).parent
    return {str(p.relative_to(root.parent)): p.read_text() for p in sorted(root.rglob("*.py"))}


def test_the_check_catches_an_unused_query_a_misspelt_parameter_and_an_unknown_query():
    queries = {"thing_get": "SELECT %(id)s, %(kind)s", "thing_list": "SELECT 1",
               "thing_delete_if_old": "DELETE FROM t WHERE id = %(id)s"}
    module = '''
async def read(tx, key):
    await tx.one("thing_get", idd=key, kind="x")
    await tx.run("thing_drop", id=key)
    params = {"id": key}
    await tx.run("thing_delete_if_old", **params)
'''
    assert problems(queries, {"m.py": module}) == [
        "m.py:3: thing_get binds ['id', 'kind']; the call passes ['idd', 'kind'] "
        "(missing ['id'], unknown ['idd'])",
        "m.py:4: no query named 'thing_drop'",
        "query 'thing_list' is called nowhere",
    ]
    fixed = module.replace("idd=", "id=").replace('"thing_drop"', '"thing_list"').replace(
        'tx.run("thing_list", id=key)', 'tx.run("thing_list")')
    assert problems(queries, {"m.py": fixed}) == []


def test_the_check_follows_a_query_name_a_function_returns():
    queries = {"thing_get_narrow": "SELECT %(id)s", "thing_get_wide": "SELECT %(id)s, %(n)s"}
    module = '''
def which(wide):
    return "thing_get_wide" if wide else "thing_get_narrow"

async def read(tx, key, wide):
    await tx.all(which(wide), id=key)
'''
    assert problems(queries, {"m.py": module}) == [
        "m.py:6: thing_get_wide binds ['id', 'n']; the call passes ['id'] "
        "(missing ['n'], unknown [])"]


def test_every_query_is_called_with_exactly_its_parameters():
    queries = {name: query.sql for name, query in all_queries().items()}
    found = problems(queries, _source_modules())
    assert not found, "\n".join(found)


def test_every_fragment_is_included_by_some_query_or_fragment():
    included = {f for query in all_queries().values() for f in query.fragments}
    included |= {f for text in all_fragments().values() for f in re.findall(r"\{\{(\w+)\}\}", text)}
    assert set(all_fragments()) == included


@pytest.mark.storage
def test_every_query_with_the_claimed_row_returns_what_task_attempt_reads(db_url):
    wanted = {f.name for f in dataclasses.fields(TaskAttempt)}
    users = [q for q in all_queries().values() if "claimed_row" in q.fragments]
    assert len(users) >= 7, [q.name for q in users]  # 2 claims, hedge, 2 sweeps, 2 wakes
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i, query in enumerate(users):
            statement = f"konduit_claimed_{i}".encode()
            conn.pgconn.prepare(statement, _positional(query.sql).encode())
            described = conn.pgconn.describe_prepared(statement)
            columns = {(described.fname(n) or b"").decode() for n in range(described.nfields)}
            assert wanted <= columns, f"{query.name} lacks {sorted(wanted - columns)}"


# The guards of migration 0020: inlined by the planner, or they would cost a function call per
# row and hide their conditions from index and partial-index matching.
GUARDS = ("konduit_lease_held", "konduit_lease_or_hedge_held", "konduit_lease_or_hedge_held_any",
          "konduit_lease_lapsed", "konduit_lease_rescuable", "konduit_deadline_after",
          "konduit_fallback_settled", "konduit_deadline_ahead")


@pytest.mark.storage
def test_every_lease_guard_is_inlined_in_the_plans_of_its_statements(db_url):
    guard_call = re.compile(rf"\b(?:{'|'.join(GUARDS)})\(")
    users = [q for q in all_queries().values() if guard_call.search(q.sql)]
    assert len(users) >= 12, [q.name for q in users]
    with psycopg.connect(db_url, autocommit=True) as conn:
        if conn.info.server_version < 160000:
            # The plans are the same on every version; the first run of .ci/run (PostgreSQL
            # 18) checks them.
            pytest.skip("EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16 or later")
        plans = {q.name: "\n".join(
            str(row[0]) for row in conn.execute(
                f"EXPLAIN (GENERIC_PLAN, COSTS OFF) {_positional(q.sql)}").fetchall())
            for q in users}
    # The check sees a function the planner could not inline (its body holds a subquery).
    assert "konduit_lease_holder_alive(" in plans["task_lose_if_rescuable"]
    called = {name: guard_call.findall(plan) for name, plan in plans.items()}
    assert not any(called.values()), {name: c for name, c in called.items() if c}


def test_fragments_expand_at_their_column_inside_each_other_and_never_in_a_circle():
    text = """-- fragment: pair
-- Two columns.
a,
{{last}}
-- fragment: last
-- One column.
b
-- name: thing_get
-- A row.
SELECT 1,
       {{pair}}
FROM t;
"""
    assert parse_queries(text)["thing_get"].sql == "SELECT 1,\n       a,\n       b\nFROM t"
    assert parse_queries(text)["thing_get"].fragments == {"pair"}
    with pytest.raises(ValueError, match="includes itself"):
        parse_queries(text.replace("{{last}}", "{{pair}}"))
    with pytest.raises(ValueError, match="no fragment named 'lost'"):
        parse_queries(text.replace("{{last}}", "{{lost}}"))
