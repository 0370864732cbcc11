"""Every statement on the completion path touches exactly one execution (one Citus shard).

docs/scaling.md distributes the execution-scoped tables by execution id (Citus). A statement
then stays on one shard only if every row it can reach is reached through a key of one
execution. This test records, with a wrapper around the real :class:`~konduit.db.database.Tx`,
every statement (query name, bound parameters) that a real worker runs while it records outcomes
and makes fan-in decisions for fan-out/fan-in executions (map fan-out, static branches, a join,
a step after it, an adaptive deadline), and checks two things about each:

1. **Its keys name one execution.** The execution ids it binds (``id``/``execution_id``/
   ``ids``/``execution_ids``), the task ids (``task_id``/``task_ids``, integer ``id``/``ids``)
   and the lease tokens (``lease_token``/``lease_tokens``) are mapped to their executions
   through the database. A statement of the per-execution fan-in decision (anything called from
   ``engine/advancer.py``) must map to exactly one execution. A statement of the completer's
   batch (the round of ``engine/round.py``, entered through ``engine/completer.py``, which
   records the outcomes of several executions that ended together in one transaction) may map
   to several only if it is listed in :data:`CROSS_EXECUTION_BATCH`: each of its rows is
   addressed by its own key, so on Citus it is a multi-shard statement routed row by row,
   never a scan.
2. **Its plan reaches execution-scoped rows only through those keys.** The statement is
   EXPLAINed on the real server with the same parameters (sequential scans, hash and merge
   joins off, so that conditions sit on the scans they restrict); every scan of an
   execution-scoped table must carry an equality on that table's key column (execution id,
   task id, lease token), not joined by OR. A statement that binds an execution id but also
   reads, say, every attempt of a step across executions fails here even though check 1 passes.

A statement binding no key at all passes only if its plan touches no execution-scoped table
(``pg_notify``). The only exception is :data:`HISTORY_READS`: the adaptive deadline reads the
step's latency history across executions (cached per process for 30 s); on Citus it is a
multi-shard read, listed in docs/scaling.md as such.

The check fails when someone adds a statement reading across executions: a demonstration is
``test_the_check_catches_statements_that_read_across_executions`` below.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import konduit
from konduit.db.database import Tx
from konduit.db.queries import q
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

EXECUTIONS = 12
ITEMS = 3

# Execution-scoped tables (distributed by execution id on Citus) and the columns through which a
# statement may reach their rows: the execution id, or a key that belongs to one execution.
KEY_COLUMNS: dict[str, set[str]] = {
    "konduit_executions": {"id"},
    "konduit_steps": {"execution_id"},
    "konduit_tasks": {"execution_id", "id"},
    "konduit_outputs": {"execution_id"},
    "konduit_execution_outputs": {"execution_id"},
    "konduit_attempts": {"task_id", "lease_token", "id"},  # an attempt is one task's
}

CROSS_EXECUTION_BATCH = {
    # The completer's set-based writes for the outcomes of several executions in one
    # transaction: each row keyed by its own execution id, task id or lease token.
    "execution_lock_many_in_id_order",
    "task_complete_many_if_leased",
    "output_insert_many_across_executions_if_absent",
    "attempt_finish_many_if_open",
    # The round's fan-in decisions read and write their join state set-based too: each row
    # addressed by its (execution id, step) key.
    "step_get_many_across_executions",
    "step_update_many_across_executions",
    "execution_set_steps_pending_many_if_running_and_changed",
    # The same writes folded into fewer statements (issue 20): ends + outputs + attempts, and
    # step rows + the executions' counts of steps pending.
    "task_complete_many_if_leased_storing_outputs_and_attempts",
    "step_update_many_across_executions_with_steps_pending",
    # The round's wake-up when its claim went out with the COMMIT: whether a task it made ready
    # is still ready, each read by its (execution id, step) key.
    "task_notify_ready_if_unclaimed",
}
HISTORY_READS = {
    # Adaptive deadline: a quantile of the step's successful durations over all executions.
    "step_duration_quantile",
    # Window-aware budgets: the p99 spans of the workflow's steps (the plan's history) and the
    # overheads of its newest succeeded executions (fallback, dispatch, finish: the reserve).
    "step_span_quantiles_by_workflow",
    "workflow_overhead_quantiles",
}

CLAIMS = {
    # A worker claims the slots a round of outcomes freed in that round's transaction
    # (Worker._record_group): the claim rides on the completion path but is the claimer's
    # statement, a scan of ready tasks across executions by nature (docs/scaling.md, "The claim").
    "task_claim_batch",
    # The same claim for a worker with flow-limited steps: the lock of their (workflow, step)
    # rows, then the claim (docs/flow-control.md).
    "flow_limit_lock_if_ready",
    "task_claim_batch_flow_limited",
}

_ENGINE = Path(konduit.__file__).parent / "engine"
_ADVANCER = str(_ENGINE / "advancer.py")
_COMPLETER = str(_ENGINE / "completer.py")
_ROUND = str(_ENGINE / "round.py")
_DEADLINES = str(_ENGINE / "deadlines.py")


@dataclass
class Statement:
    name: str
    sql: str
    params: dict[str, Any]
    path: str  # "advance" (per-execution fan-in decision) or "batch" (the completer's writes)


def _path_of_caller() -> str | None:
    """Which part of the completion path issued the statement, from the (coroutine) stack."""
    frame = sys._getframe(2)
    files: set[str] = set()
    while frame is not None:
        files.add(frame.f_code.co_filename)
        frame = frame.f_back  # type: ignore[assignment]
    if _COMPLETER not in files and _ROUND not in files:
        return None  # claims, heartbeats, starts, sweeps: not the completion path
    return "advance" if (_ADVANCER in files or _DEADLINES in files) else "batch"


def recording(log: list[Statement], lock: threading.Lock) -> dict[str, Any]:
    """Replacements for Tx.one/all/run that record completion-path statements, then run them."""
    originals = {name: getattr(Tx, name) for name in ("one", "all", "run", "send", "later")}

    def wrap(name: str) -> Any:
        original = originals[name]

        async def call(self: Tx, query: str, /, **params: Any) -> Any:
            path = _path_of_caller()
            if path is not None and query not in CLAIMS:
                with lock:
                    log.append(Statement(query, q(query), dict(params), path))
            return await original(self, query, **params)

        return call

    return {name: wrap(name) for name in originals}


# -- check 1: which executions a statement's keys belong to -------------------------------------

def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


@dataclass
class Keys:
    executions: set[uuid.UUID]
    tasks: set[int]
    leases: set[uuid.UUID]

    @property
    def empty(self) -> bool:
        return not (self.executions or self.tasks or self.leases)


def keys_of(params: dict[str, Any]) -> Keys:
    keys = Keys(set(), set(), set())
    for name, value in params.items():
        for item in _as_list(value):
            if item is None:
                continue
            if name in ("id", "ids", "execution_id", "execution_ids"):
                if isinstance(item, int) and name in ("id", "ids"):
                    keys.tasks.add(item)
                elif (u := _uuid(item)) is not None:
                    keys.executions.add(u)
            elif name in ("task_id", "task_ids") and isinstance(item, int):
                keys.tasks.add(item)
            elif name in ("lease_token", "lease_tokens") and (u := _uuid(item)) is not None:
                keys.leases.add(u)
    return keys


class Owners:
    """Task ids and lease tokens mapped to their executions, read after the run."""

    def __init__(self, url: str):
        with psycopg.connect(url) as conn:
            self.task = dict(conn.execute(
                "SELECT id, execution_id FROM konduit_tasks").fetchall())
            self.lease = dict(conn.execute(
                "SELECT a.lease_token, t.execution_id FROM konduit_attempts a "
                "JOIN konduit_tasks t ON t.id = a.task_id").fetchall())

    def executions(self, keys: Keys) -> set[uuid.UUID]:
        found = set(keys.executions)
        found |= {self.task[t] for t in keys.tasks if t in self.task}
        found |= {self.lease[t] for t in keys.leases if t in self.lease}
        return found


# -- check 2: the plan reaches execution-scoped rows only through keys ---------------------------

_SCAN_CONDITIONS = ("Index Cond", "Recheck Cond", "Filter", "TID Cond")
_JOIN_CONDITIONS = ("Join Filter", "Hash Cond", "Merge Cond")
_OPERAND = r"(?:[\w.]+|'[^']*'(?:::[\w\[\] ]+)?|\$\d+)"
_EQUALITY = re.compile(rf"({_OPERAND})\s*=\s*(?:ANY\s*\(\s*)?({_OPERAND})")


def _keyed(condition: str, alias: str, columns: set[str], sources: set[str] | None) -> bool:
    """An equality on one of ``columns`` of the scan ``alias`` in ``condition``, not as one arm
    of an OR. ``sources`` is None for the scan's own conditions (an index condition may compare
    with an outer row: that row's scan is checked in turn); for a join node's condition above
    the scan, the other side must be a constant, a parameter or a column of a function scan
    (``unnest`` of parameters), since a join with another table restricts nothing by itself."""
    if re.search(r"\bOR\b", condition):
        return False
    mine = {*columns, *(f"{alias}.{c}" for c in columns)}
    for left, right in _EQUALITY.findall(condition):
        for side, other in ((left, right), (right, left)):
            if side not in mine:
                continue
            if sources is None or other.startswith(("'", "$")) or other.isdigit():
                return True
            if "." in other and other.split(".", 1)[0] in sources:
                return True
    return False


def _function_scans(plan: dict[str, Any]) -> set[str]:
    found = {str(plan["Alias"])} if plan.get("Node Type") == "Function Scan" else set()
    for child in plan.get("Plans", []):
        found |= _function_scans(child)
    return found


def unkeyed_scans(plan: dict[str, Any], inherited: tuple[str, ...] = (),
                  sources: set[str] | None = None) -> list[str]:
    """Scans of execution-scoped tables in ``plan`` that no key equality restricts."""
    if sources is None:
        sources = _function_scans(plan)
    found = []
    own = " AND ".join(str(plan[c]) for c in _SCAN_CONDITIONS if c in plan)
    relation = plan.get("Relation Name")
    if relation in KEY_COLUMNS and plan.get("Node Type") != "ModifyTable":
        alias = str(plan.get("Alias") or relation)
        columns = KEY_COLUMNS[str(relation)]
        bitmap = " AND ".join(
            str(child["Index Cond"]) for child in plan.get("Plans", [])
            if child.get("Node Type") == "Bitmap Index Scan" and "Index Cond" in child
        )
        if not (any(part and _keyed(part, alias, columns, None) for part in (own, bitmap))
                or any(_keyed(part, alias, columns, sources) for part in inherited)):
            found.append(f"{plan.get('Node Type')} on {relation} {alias} "
                         f"[{own or 'no condition'}]")
    joined = tuple(str(plan[c]) for c in _JOIN_CONDITIONS if c in plan)
    for child in plan.get("Plans", []):
        found += unkeyed_scans(child, inherited + joined, sources)
    return found


def shard_keyed(plan: dict[str, Any], inherited: tuple[str, ...] = (),
                executions: set[str] | None = None) -> bool:
    """Whether every scan of an execution-scoped table compares its execution id with a
    constant (or with the id of the execution row the statement selected by a constant): what
    Citus needs to route the statement to one shard (a task id or lease token identifies one
    execution's row, but Citus cannot tell which shard holds it). Reported, not asserted:
    docs/scaling.md lists what would change."""
    if executions is None:
        executions = _aliases(plan, "konduit_executions")
    relation = plan.get("Relation Name")
    own = " AND ".join(str(plan[c]) for c in _SCAN_CONDITIONS if c in plan)
    ok = True
    if relation in KEY_COLUMNS and plan.get("Node Type") != "ModifyTable":
        alias = str(plan.get("Alias") or relation)
        column = {"id"} if relation == "konduit_executions" else {"execution_id"}
        others = set() if relation == "konduit_executions" else executions
        ok = any(_keyed(part, alias, column, others) for part in (own, *inherited) if part)
    joined = tuple(str(plan[c]) for c in _JOIN_CONDITIONS if c in plan)
    return ok and all(shard_keyed(child, inherited + joined, executions)
                      for child in plan.get("Plans", []))


def _aliases(plan: dict[str, Any], relation: str) -> set[str]:
    found = {str(plan.get("Alias"))} if plan.get("Relation Name") == relation else set()
    for child in plan.get("Plans", []):
        found |= _aliases(child, relation)
    return found


def touched_tables(plan: dict[str, Any]) -> set[str]:
    tables = {plan["Relation Name"]} if plan.get("Relation Name") in KEY_COLUMNS else set()
    for child in plan.get("Plans", []):
        tables |= touched_tables(child)
    return tables


def explain(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> dict[str, Any]:
    with conn.transaction(force_rollback=True):
        for setting in ("enable_seqscan", "enable_hashjoin", "enable_mergejoin"):
            conn.execute(f"SET LOCAL {setting} = off")
        row = conn.execute(f"EXPLAIN (FORMAT JSON, VERBOSE false) {sql}", params).fetchone()
    assert row is not None
    data = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(data[0]["Plan"])


def problems_of(statements: list[Statement], owners: Owners,
                conn: psycopg.Connection[Any]) -> list[str]:
    """Every violation of checks 1 and 2 among ``statements`` (one line each)."""
    problems: list[str] = []
    planned: dict[str, dict[str, Any]] = {}
    for st in statements:
        keys = keys_of(st.params)
        executions = owners.executions(keys)
        if st.name not in planned:
            planned[st.name] = explain(conn, st.sql, st.params)
        plan = planned[st.name]
        if st.name in HISTORY_READS:
            continue
        if keys.empty:
            if touched_tables(plan):
                problems.append(f"{st.name} ({st.path}): binds no execution key but touches "
                                f"{sorted(touched_tables(plan))}")
            continue
        if not executions:
            problems.append(f"{st.name} ({st.path}): its keys belong to no execution")
        elif len(executions) > 1 and (st.path == "advance"
                                      or st.name not in CROSS_EXECUTION_BATCH):
            problems.append(f"{st.name} ({st.path}): keyed by {len(executions)} executions")
    routed = sorted(n for n, p in planned.items() if touched_tables(p) and not shard_keyed(p))
    print(f"reached by task id or lease token, not by a constant execution id: {routed}")
    for name, plan in planned.items():
        if name in HISTORY_READS:
            continue
        for scan in unkeyed_scans(plan):
            problems.append(f"{name}: reaches rows without a key: {scan}")
    return sorted(set(problems))


# -- the run ------------------------------------------------------------------------------------

def fan_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("one-shard", version=1)

    @wf.step()
    def root(ctx: konduit.Context) -> list[int]:
        return list(range(ITEMS))

    @wf.map(after=[root], over=lambda items: items)
    def square(ctx: konduit.Context) -> int:
        return int(ctx.item) ** 2

    @wf.step(after=[root], deadline=konduit.Deadline.adaptive(default="30s"))
    async def timed(ctx: konduit.Context) -> str:
        return "t"

    @wf.step(after=[root], required=False)
    def flaky(ctx: konduit.Context) -> str:
        raise konduit.NonRetryableError("optional branch fails")

    @wf.step(after=[square, timed, flaky], join=konduit.Join.required())
    def join(ctx: konduit.Context) -> int:
        return sum(ctx.upstream["square"])

    @wf.step(after=[join])
    def publish(ctx: konduit.Context) -> int:
        return int(ctx.upstream["join"]) + 1

    return wf


def test_every_completion_statement_touches_one_execution(
        make_app: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[Statement] = []
    for name, replacement in recording(log, threading.Lock()).items():
        monkeypatch.setattr(Tx, name, replacement)
    app = make_app(fan_workflow())
    with running_worker(app, concurrency=8):
        # Every other execution has a window, tight enough to cut the adaptive deadline of
        # 'timed' (its own 30 s): the window-aware budget's read and cut are on the path too.
        handles = [app.start("one-shard", input={"n": i}, deadline_at=None if i % 2 else
                             datetime.now(UTC) + timedelta(seconds=20))
                   for i in range(EXECUTIONS)]
        deadline = time.monotonic() + 60
        for handle in handles:
            result = handle.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert result.output == sum(i * i for i in range(ITEMS)) + 1
    monkeypatch.undo()

    names = defaultdict(set)
    for st in log:
        names[st.path].add(st.name)
    print({path: sorted(found) for path, found in names.items()})
    # The recording saw the whole path, or the check below would pass vacuously.
    seen = names["advance"] | names["batch"]
    for expected in ("task_insert_many", "task_insert_map_chunk_if_running",
                     "execution_finish_if_running", "step_duration_quantile",
                     "step_span_quantiles_by_workflow", "workflow_overhead_quantiles"):
        assert expected in seen, f"{expected} never ran on the completion path: {sorted(seen)}"
    assert names["batch"], "no statement of the completer's own writes was recorded"

    with psycopg.connect(db_url, autocommit=True) as conn:
        (cut,) = conn.execute("SELECT count(*) FROM konduit_tasks WHERE step = 'timed'"
                              " AND deadline_uncut_seconds IS NOT NULL").fetchone()  # type: ignore[misc]
        assert cut == EXECUTIONS // 2, "the windows never cut a budget: that path went unchecked"
        problems = problems_of(log, Owners(db_url), conn)
    assert not problems, "\n".join(problems)


def test_the_check_catches_statements_that_read_across_executions(
        make_app: Any, db_url: str) -> None:
    """The checker itself, on statements that break the rule: it must name each of them."""
    app = make_app(fan_workflow())
    with running_worker(app, concurrency=4):
        first, second = (app.start("one-shard", input={"n": i}) for i in range(2))
        first.wait(timeout=30)
        second.wait(timeout=30)
    a, b = first.id, second.id
    bad = [
        # Binds one execution id, but the second arm reads every execution's tasks of a step.
        Statement("union_read", "SELECT id FROM konduit_tasks WHERE execution_id = %(execution_id)s "
                  "UNION ALL SELECT id FROM konduit_tasks WHERE step = %(step)s",
                  {"execution_id": a, "step": "join"}, "advance"),
        # An OR that widens the key.
        Statement("or_read", "SELECT * FROM konduit_steps WHERE execution_id = %(execution_id)s "
                  "OR status = 'failed'", {"execution_id": a}, "advance"),
        # Two executions in a per-execution decision.
        Statement("two_executions", q("step_get_outcomes"),
                  {"execution_id": a, "steps": ["join"], "ids": [b]}, "advance"),
        # A batch statement keyed by several executions that nobody marked as such.
        Statement("unmarked_batch", "SELECT id FROM konduit_executions WHERE id = ANY(%(ids)s)",
                  {"ids": [a, b]}, "batch"),
        # The adaptive deadline's history read, were it not listed in HISTORY_READS.
        Statement("history_unlisted", q("step_duration_quantile"),
                  {"workflow_name": "one-shard", "step": "timed", "quantile": 0.99,
                   "window_seconds": 3600.0, "max_samples": 1000}, "advance"),
        # Binds one execution id, yet joins the attempts of a step across executions.
        Statement("history_beside_a_key",
                  "SELECT count(*) FROM konduit_attempts a JOIN konduit_tasks t "
                  "ON t.id = a.task_id WHERE t.step = %(step)s AND EXISTS "
                  "(SELECT 1 FROM konduit_executions e WHERE e.id = %(execution_id)s)",
                  {"step": "join", "execution_id": a}, "advance"),
        # No key at all, on an execution-scoped table.
        Statement("keyless", "SELECT count(*) FROM konduit_outputs WHERE step = %(step)s",
                  {"step": "join"}, "batch"),
    ]
    good = [
        Statement("step_get_outcomes", q("step_get_outcomes"),
                  {"execution_id": a, "steps": ["join"]}, "advance"),
        # A marked batch statement, each row by its own key.
        Statement(sorted(CROSS_EXECUTION_BATCH)[0],
                  "SELECT id FROM konduit_executions WHERE id = ANY(%(ids)s::uuid[]) "
                  "ORDER BY id FOR NO KEY UPDATE", {"ids": [a, b]}, "batch"),
    ]
    with psycopg.connect(db_url, autocommit=True) as conn:
        owners = Owners(db_url)
        assert problems_of(good, owners, conn) == []
        problems = problems_of(bad, owners, conn)
    for st in bad:
        assert any(p.startswith(st.name) for p in problems), f"{st.name} not caught: {problems}"
