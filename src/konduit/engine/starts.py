"""Starting executions set-based: one statement creates many executions, their steps' join
state and their root tasks (``execution_insert_many_with_roots``).

A start costs a fixed number of statements however many roots its workflow has and however many
executions are started together: the rows of each workflow's steps are sent once per batch as a
*template* and joined to the new executions inside PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from konduit.core import limit_keys
from konduit.core.advance import initial_states
from konduit.core.durations import parse_duration
from konduit.core.fair import check_key, fair_key
from konduit.core.ids import uuid7
from konduit.core.key_paths import KeyPath
from konduit.core.payloads import canonical_json, content_hash
from konduit.core.requests import StartRequest
from konduit.core.search import check_tags
from konduit.core.validation import readable_last_line
from konduit.core.values import check_text, check_whole
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Tx
from konduit.engine.deadlines import budgets, task_budgets
from konduit.engine.later import check_moment, check_priority, start_time
from konduit.engine.limit_keys import KeyedStart, store_and_admit
from konduit.engine.registry import workflow_key
from konduit.engine.stored import SpecSource, StoredSpecs
from konduit.errors import (
    IdempotencyConflict,
    InputValidationError,
    KeyNeedsCode,
    KonduitError,
    UserCodeStuck,
    blame,
    blamed,
)
from konduit.threads import HandlerThreads, call_within
from konduit.tracing import TraceContext

START_CODE_SECONDS = 10.0
"""How long the user code of a start may take: the workflow's input checks and key functions
(``fair_by=``, per-key limits). Past it that start fails with an error that says so (see
:func:`prepare_off_loop`)."""

START_CODE_MAX_HUNG = 8
"""Calls of start-time code that may be left running past :data:`START_CODE_SECONDS` in one
process (a thread cannot be killed). Past them a start that needs such code is refused with
:class:`~konduit.errors.UserCodeStuck` until one returns, instead of leaving one more thread
behind each time (a schedule's tick, every second)."""

_start_threads = HandlerThreads(
    name="konduit-start-code", max_abandoned=START_CODE_MAX_HUNG, process_wide=True,
    what="start-time code (input checks and key functions, fair_by)")

BATCH_ROWS = 2_000
"""Executions per statement: a bigger batch is split into statements of this many, all in one
transaction (still atomic), so each statement's rows and their key checks stay a bounded chunk
of memory on both sides."""


@dataclass
class Prepared:
    """A request checked and encoded, with the id it gets if it creates an execution."""

    id: UUID
    spec: WorkflowSpec
    encoded: str
    input_hash: str
    idempotency_key: str | None
    deadline_at: datetime | None
    timeout_seconds: float | None
    trace: TraceContext | None = None  # the caller's W3C trace context, when tracing is on
    tags: str | None = None  # compact JSON of the checked tags
    run_at: datetime | None = None
    delay_seconds: float | None = None
    priority: int = 0
    fair_key: str | None = None  # Workflow(fair_by=)'s key of the input (docs/fairness.md)
    limit_keys: dict[str, str] | None = None  # each per-key limited step's key (migration 0026)
    run_key: str | None = None  # the key under Workflow(max_running=)


def check_timeout_at(run_at: datetime, timeout_seconds: float) -> None:
    """The moment a start at ``run_at`` times out must be one a datetime can hold (before the
    year 10000): PostgreSQL would store a later one, and no face could read it back."""
    try:
        (run_at + timedelta(seconds=timeout_seconds)).astimezone(UTC)
    except OverflowError:
        raise blamed(KonduitError(
            f"timeout {timeout_seconds:.0f} s after run_at {run_at.isoformat()} is past the "
            f"year 9999"), "timeout") from None


def check_values(request: StartRequest) -> None:
    """The plain values of a start that reach the database as they are (its workflow's name
    and version, its idempotency key): text PostgreSQL can hold, a version in its column's
    range. Checked before anything is looked up by them."""
    check_text(request.workflow, "workflow")
    check_text(request.idempotency_key, "idempotency_key")
    if request.version is not None:
        check_whole(request.version, "version")


def prepare(registry: SpecSource, request: StartRequest, *, max_bytes: int,
            trace: TraceContext | None = None) -> Prepared:
    """Check one request before anything is written: its timeout, workflow and input."""
    with blame("timeout"):
        timeout_seconds = (
            None if request.timeout is None else parse_duration(request.timeout, what="timeout")
        )
    with blame("tags"):
        tags = check_tags(request.tags)
    run_at, delay_seconds = start_time(request.run_at, request.delay)
    if run_at is not None and timeout_seconds is not None:
        check_timeout_at(run_at, timeout_seconds)
    if isinstance(request.deadline_at, datetime) and request.deadline_at.tzinfo is not None:
        check_moment(request.deadline_at, "deadline_at")
    priority = check_priority(request.priority)
    with blame("version" if request.version is not None else "workflow"):
        spec = registry.get(request.workflow, request.version)
    with blame("input"):
        checked = spec.check_input(request.input)
        encoded = canonical_json(
            checked, what=f"input of workflow {request.workflow!r}", max_bytes=max_bytes
        )
    # The key from the input as stored: a path reads it; a function is code, and a definition
    # read from the database has only its name (a start without fair_key= is refused then).
    if request.fair_key is not None:
        with blame("fair_key"):
            key: str | None = check_key(request.fair_key,
                                        what=f"fair_key of a start of {spec.name!r}:")
    else:
        with blame("input"):
            key = None if spec.fair_by is None else fair_key(spec.fair_by, checked,
                                                             workflow=spec.name)
    keys, run = _keys(spec, checked)
    return Prepared(
        id=uuid7(),
        spec=spec,
        encoded=encoded,
        input_hash=content_hash(encoded),
        idempotency_key=request.idempotency_key,
        deadline_at=request.deadline_at,
        timeout_seconds=timeout_seconds,
        trace=trace,
        tags=None if tags is None else json.dumps(tags, separators=(",", ":")),
        run_at=run_at,
        delay_seconds=delay_seconds,
        priority=priority,
        fair_key=key,
        limit_keys=keys,
        run_key=run,
    )


async def prepare_off_loop(registry: SpecSource, request: StartRequest, *, max_bytes: int,
                           trace: TraceContext | None = None) -> Prepared:
    """:func:`prepare` on a thread, for at most :data:`START_CODE_SECONDS`: the workflow's input
    checks and key functions are user code, and one that never returns must fail its start, not
    hold the loop that called it (a worker's, whose heartbeats keep its leases; an App's, which
    every thread of the process shares; the API server's). The thread is abandoned past the
    limit."""
    [prepared] = await prepare_many_off_loop(registry, [request], max_bytes=max_bytes,
                                             trace=trace, one=True)
    return prepared


async def prepare_many_off_loop(registry: SpecSource, requests: list[StartRequest], *,
                                max_bytes: int, trace: TraceContext | None = None,
                                one: bool = False) -> list[Prepared]:
    """:func:`prepare` of every request on one thread (a single hop for a whole batch), for at
    most :data:`START_CODE_SECONDS` plus a millisecond a request. Each fault is named by its
    request's index (:func:`at_request`) unless ``one``."""

    def prepare_all() -> list[Prepared]:
        out: list[Prepared] = []
        for i, request in enumerate(requests):
            try:
                out.append(prepare(registry, request, max_bytes=max_bytes, trace=trace))
            except KonduitError as exc:
                if one:
                    raise
                raise at_request(i, exc) from exc
        return out

    try:
        return await call_within(_start_threads, prepare_all,
                                 START_CODE_SECONDS + len(requests) / 1000)
    except UserCodeStuck:
        # Hung calls of other starts' code must not refuse starts that run none: those are
        # checked and encoded on the loop's own executor (bounded; nothing there can hang).
        if any(_runs_code(registry, r) for r in requests):
            raise
        return await asyncio.get_running_loop().run_in_executor(None, prepare_all)
    except TimeoutError:
        which = {r.workflow for r in requests}
        raise KonduitError(
            f"the start of workflow {', '.join(repr(w) for w in sorted(which))}: its input "
            f"checks and key functions did not return within {START_CODE_SECONDS:g} s"
            + ("" if one else f" (+ 1 ms for each of {len(requests)} requests)")) from None


def _runs_code(registry: SpecSource, request: StartRequest) -> bool:
    """Whether preparing ``request`` may call user code: a model instance as its input, an
    input model built for key functions, a ``fair_by`` or key that is a function."""
    if hasattr(request.input, "model_dump"):
        return True
    try:
        spec = registry.get(request.workflow, request.version)
    except KonduitError:
        return False  # refused without running anything
    keys = [*spec.flow_keys.values(), *([spec.run_key] if spec.max_running is not None else [])]
    fair_by = None if request.fair_key is not None else spec.fair_by
    return any(k is not None and not isinstance(k, KeyPath) for k in [*keys, fair_by])


def _keys(spec: WorkflowSpec, checked: Any) -> tuple[dict[str, str] | None, str | None]:
    try:
        return _computed_keys(spec, checked)
    except KeyNeedsCode:
        raise  # no field of the request is at fault: the process lacks the code
    except KonduitError as exc:
        raise blamed(exc, "input") from exc.__cause__


def _computed_keys(spec: WorkflowSpec,
                   checked: Any) -> tuple[dict[str, str] | None, str | None]:
    """The keys of a start's per-key limits (the user's key functions run here, before anything
    is written: one that fails refuses this start only, naming the step and the function)."""
    if not spec.flow_keys and spec.max_running is None:
        return None, None
    made: list[Any] = []

    def value() -> Any:  # the handler's view of the input, made once if a key function needs it
        if not made:
            made.append(input_model(spec, checked))
        return made[0]

    return (limit_keys.step_keys(spec.name, spec.flow_keys, checked, value),
            limit_keys.run_key(spec.name, spec.max_running, spec.run_key, checked, value))


async def rerun_keys_off_loop(spec: WorkflowSpec, stored: Any, *, run_key: bool,
                              steps: Collection[str]) -> tuple[str | None, dict[str, str] | None]:
    """The keys its start would have given an execution whose input as stored is ``stored``,
    for a repair or redrive of one started before its workflow had them (``max_running``, a
    step's per-key limit: operating settings, changed without a new version): its key under
    ``max_running`` when ``run_key`` (else None), and the keys of ``steps`` (None when none).
    Key functions run as a start runs them (on a thread, for at most
    :data:`START_CODE_SECONDS`); a refusal is a start's (:class:`~konduit.errors.KeyNeedsCode`
    without the code, :class:`~konduit.errors.LimitKeyError` naming the function)."""
    flow_keys = {s: k for s, k in spec.flow_keys.items() if s in steps}
    made: list[Any] = []

    def value() -> Any:
        if not made:
            made.append(input_model(spec, stored))
        return made[0]

    def compute() -> tuple[str | None, dict[str, str] | None]:
        return (limit_keys.run_key(spec.name, spec.max_running, spec.run_key, stored, value)
                if run_key else None,
                limit_keys.step_keys(spec.name, flow_keys, stored, value))

    keys = [*flow_keys.values(), *([spec.run_key] if run_key else [])]
    if all(k is None or isinstance(k, KeyPath) for k in keys):
        return compute()  # no user code: computed here
    try:
        return await call_within(_start_threads, compute, START_CODE_SECONDS)
    except TimeoutError:
        raise KonduitError(
            f"workflow {spec.name!r}: its key functions did not return within "
            f"{START_CODE_SECONDS:g} s") from None


def input_model(spec: WorkflowSpec, checked: Any) -> Any:
    """The input as handlers see it (the declared model's instance), for the start's key
    functions: the model's validators are user code, and whatever they raise
    (``KeyboardInterrupt`` included) refuses this start with
    :class:`~konduit.InputValidationError` naming the model."""
    try:
        return spec.handler_input(checked)
    except BaseException as exc:
        raise model_refused(spec, exc) from exc


def model_refused(spec: WorkflowSpec, exc: BaseException) -> InputValidationError:
    """An :class:`InputValidationError` saying that ``spec``'s input model raised ``exc``."""
    model = getattr(spec.input_type, "model", None)
    name = getattr(model, "__qualname__", None) or "input model"
    what = readable_last_line(exc) or f"{type(exc).__name__}: {exc}"
    return InputValidationError(
        f"input of workflow {spec.name!r}: its input model {name} raised {what}",
        {"(root)": f"{name} raised {type(exc).__name__}: {exc}"}, workflow=spec.name)


def at_request(index: int, exc: KonduitError) -> KonduitError:
    """``exc`` again, its message prefixed with the index of the request at fault."""
    message = f"start request {index}: {exc}"
    try:
        again = type(exc)(message)
    except TypeError:  # an error class whose constructor wants more than a message: the same
        again = type(exc).__new__(type(exc))  # class, its facts copied below
        Exception.__init__(again, message)
    again.__dict__.update(exc.__dict__)  # what it carries besides (InputValidationError.errors)
    again.index = index
    return again


async def start_requests(db: Database, specs: StoredSpecs, requests: list[StartRequest], *,
                         register: Callable[[WorkflowSpec], Awaitable[None]], max_bytes: int,
                         trace: TraceContext | None, one: bool = False) -> list[UUID]:
    """Start ``requests`` in one transaction, all or none, and return their executions' ids in
    request order (the engine's start and start_many both come here). Each definition is
    loaded (the code's, else the registered one), every request is checked before anything is
    written (its fault named by its index unless ``one``), this process's definitions are
    registered, and a key repeated within the batch gives every request the first one's
    execution."""
    loaded: set[tuple[str, int | None]] = set()
    for i, request in enumerate(requests):
        try:
            check_values(request)
            if (request.workflow, request.version) not in loaded:
                await specs.load(db, request.workflow, request.version)
                loaded.add((request.workflow, request.version))
        except KonduitError as exc:
            if one:
                raise
            raise at_request(i, exc) from exc
    batch = await prepare_many_off_loop(specs, requests, max_bytes=max_bytes, trace=trace,
                                        one=one)
    if not batch:
        return []
    owner = collapse_repeated_keys(batch)
    for spec in {workflow_key(p.spec.name, p.spec.version): p.spec for p in batch}.values():
        if not specs.is_stored(spec):  # a definition read from the database is registered
            await register(spec)
    distinct = [p for i, p in enumerate(batch) if owner[i] == i]
    # Pipelined: BEGIN, the keys' lock and the insert go out in one round trip.
    ids = await db.atomic(lambda tx: insert_executions(tx, distinct), pipeline=True)
    by_index = dict(zip((i for i in range(len(batch)) if owner[i] == i), ids, strict=True))
    return [by_index[owner[i]] for i in range(len(batch))]


def collapse_repeated_keys(batch: list[Prepared]) -> list[int]:
    """For each request, the index of the request whose execution it gets: itself, or the
    first request of the batch with the same workflow name and idempotency key (the same input,
    else :class:`IdempotencyConflict`)."""
    first: dict[tuple[str, str], int] = {}
    owner: list[int] = []
    for i, p in enumerate(batch):
        if p.idempotency_key is None:
            owner.append(i)
            continue
        j = first.setdefault((p.spec.name, p.idempotency_key), i)
        if batch[j].input_hash != p.input_hash:
            raise blamed(IdempotencyConflict(
                f"idempotency key {p.idempotency_key!r} is used by start requests {j} and {i} "
                f"of {p.spec.name!r} with different inputs"
            ), "idempotency_key", index=i)
        owner.append(j)
    return owner


TEMPLATE_COLUMNS = (
    "names", "versions", "workflows", "steps", "statuses", "up_totals", "tasks_totals",
    "tasks_pendings", "roots", "queues", "priorities", "max_attempts", "deadline_seconds",
    "limiteds", "policy_revisions",
)
"""The ``template_*`` parameters: one element per step of each workflow in the batch."""

_TEMPLATES: dict[tuple[str, str, tuple[float | None, ...], tuple[str, ...], int | None],
                 dict[str, str]] = {}
_TEMPLATES_KEPT = 256
"""Templates kept per process (one per workflow version, more only while adaptive budgets
change)."""


def _element(value: Any) -> str:
    """One element of a PostgreSQL array literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


async def _root_budgets(tx: Tx, spec: WorkflowSpec) -> tuple[float | None, ...]:
    """The time budget of each root step's task, in root order."""
    return tuple([
        await budgets.budget(tx, spec.name, name, spec[name].deadline)
        if spec[name].deadline is not None else None
        for name in spec.roots
    ])


def _template(spec: WorkflowSpec, root_budgets: tuple[float | None, ...]) -> dict[str, str]:
    """The rows of a new execution's steps (and, for roots, of their tasks) as the elements of
    each ``template_*`` array literal, without braces: the templates of several workflows join
    with a comma."""
    states, _, roots = initial_states(spec)
    budget_of = dict(zip(roots, root_budgets, strict=True))
    key = workflow_key(spec.name, spec.version)
    columns: dict[str, list[Any]] = {c: [] for c in TEMPLATE_COLUMNS}
    for name in spec.order:
        step, state, root = spec[name], states[name], name in budget_of
        assert not (root and step.is_map), "a map step always has an upstream"
        for column, value in zip(TEMPLATE_COLUMNS, (
            spec.name, spec.version, key, name, state.status, len(step.after),
            state.tasks_total, state.tasks_pending, root, step.queue, step.priority,
            step.retry.max_attempts, budget_of.get(name), step.flow is not None,
            spec.policy_revision,
        ), strict=True):
            columns[column].append(value)
    return {c: ",".join(map(_element, values)) for c, values in columns.items()}


async def template_for(tx: Tx, specs: Iterable[WorkflowSpec]) -> dict[str, str]:
    """The ``template_*`` parameters of ``execution_insert_many_with_roots`` for these
    workflows, as array literals: built once per workflow version (and set of budgets), then
    reused, so a start of a 500-step workflow does not encode 500 rows again."""
    parts = []
    for spec in specs:
        root_budgets = await _root_budgets(tx, spec)
        # Flow limits are not in the spec hash (they change without a new version).
        key = (workflow_key(spec.name, spec.version), spec.spec_hash, root_budgets,
               tuple(spec.flow_limits), spec.policy_revision)
        template = _TEMPLATES.get(key)
        if template is None:
            if len(_TEMPLATES) >= _TEMPLATES_KEPT:
                _TEMPLATES.clear()
            template = _TEMPLATES[key] = _template(spec, root_budgets)
        parts.append(template)
    return {f"template_{c}": "{" + ",".join(p[c] for p in parts) + "}" for c in TEMPLATE_COLUMNS}


async def insert_executions(tx: Tx, batch: list[Prepared], *, roots: bool = True) -> list[UUID]:
    """Create the executions of ``batch`` (requests with distinct idempotency keys) with their
    steps and root tasks; a key already used returns its execution's id (same input) or raises
    :class:`IdempotencyConflict`. Ids come back in batch order. Without ``roots`` no task is
    created (a fork, :mod:`konduit.engine.forks`, starts the steps its plan says itself, after
    rewriting their join state)."""
    await _lock_idempotency_keys(tx, batch)
    specs = {workflow_key(p.spec.name, p.spec.version): p.spec for p in batch}
    template = await template_for(tx, specs.values())
    if not roots:
        template = {**template, "template_roots": "{" + ",".join(
            "f" for spec in specs.values() for _ in spec.order) + "}"}
    created: list[bool] = []
    if len(batch) > BATCH_ROWS:
        await _lock_fair_keys(tx, batch)
    for first in range(0, len(batch), BATCH_ROWS):
        chunk = batch[first : first + BATCH_ROWS]
        inputs = [p.encoded for p in chunk]
        if tx.io.active:  # one text of several inputs: each sealed here, in its execution's name
            inputs = await tx.io.seal_many(inputs, [p.id for p in chunk])
        row = await tx.one(
            "execution_insert_many_with_roots",
            # The batch is one flow of fair turns across its chunks (migration 0019).
            first_ordinal=first,
            ids=[p.id for p in chunk],
            workflow_names=[p.spec.name for p in chunk],
            workflow_versions=[p.spec.version for p in chunk],
            inputs="\n".join(inputs),
            input_hashes=[p.input_hash for p in chunk],
            idempotency_keys=[p.idempotency_key for p in chunk],
            steps_pendings=[len(p.spec.steps) for p in chunk],
            deadline_ats=[p.deadline_at for p in chunk],
            timeout_seconds=[p.timeout_seconds for p in chunk],
            **_traces(chunk),
            tags=None if all(p.tags is None for p in chunk) else [p.tags for p in chunk],
            run_ats=[p.run_at for p in chunk],
            delays=[p.delay_seconds for p in chunk],
            priorities=[p.priority for p in chunk],
            fair_keys=(None if all(p.fair_key is None for p in chunk)
                       else [p.fair_key for p in chunk]),
            **template,
        )
        assert row is not None
        made = set(row["created"])
        created.extend(p.id in made for p in chunk)
    # A start later is left uncut: a cut budget is a moment from now, and its tasks wait for
    # their start (their deadline then runs from the first claim, as a join's does).
    await _cut_root_budgets(tx, [p for p, is_new in zip(batch, created, strict=True)
                                 if is_new and p.deadline_at is not None
                                 and p.run_at is None and p.delay_seconds is None])
    await store_and_admit(tx, [
        KeyedStart(p.id, p.spec.name, p.limit_keys, p.run_key, p.spec.max_running)
        for p, is_new in zip(batch, created, strict=True)
        if is_new and (p.limit_keys is not None or p.run_key is not None)])
    taken = [i for i, is_new in enumerate(created) if not is_new]
    existing = await _existing(tx, [batch[i] for i in taken]) if taken else []
    ids = [p.id for p in batch]
    for i, eid in zip(taken, existing, strict=True):
        ids[i] = eid
    return ids


async def _lock_idempotency_keys(tx: Tx, batch: list[Prepared]) -> None:
    """Hold the batch's idempotency keys against a move into the history (migration 0041,
    ``execution_lock_idempotency_keys``) before the insert, in a statement of its own: the
    insert's snapshot then sees a move that committed meanwhile (its key's history row), and a
    move that comes later skips these keys until this transaction ends. Only a start with keys
    sends it; queued in a pipelined transaction (no round trip of its own)."""
    keyed = [p for p in batch if p.idempotency_key is not None]
    if keyed:
        await tx.send("execution_lock_idempotency_keys",
                      workflow_names=[p.spec.name for p in keyed],
                      idempotency_keys=[p.idempotency_key for p in keyed])


async def _lock_fair_keys(tx: Tx, batch: list[Prepared]) -> None:
    """Lock the fair key rows of a batch of several statements up front, in one order
    (``fair_key_lock_many``): no two batches then wait for each other's keys crosswise."""
    pairs = sorted({(p.spec[root].queue, p.fair_key) for p in batch if p.fair_key is not None
                    for root in p.spec.roots})
    if pairs:
        await tx.run("fair_key_lock_many", queues=[q for q, _ in pairs],
                     fair_keys=[k for _, k in pairs])


async def _cut_root_budgets(tx: Tx, windowed: list[Prepared]) -> None:
    """Cut the budgets of the root tasks of new executions with a window by it
    (:mod:`konduit.core.budgets`); the template they were made from knows no window. Two
    statements more, and only for windowed starts of workflows whose roots have deadlines."""
    windowed = [p for p in windowed
                if any(p.spec[name].deadline is not None for name in p.spec.roots)]
    if not windowed:
        return
    left = {r["id"]: r["left_seconds"] for r in await tx.all(
        "execution_window_left_many", ids=[p.id for p in windowed])}
    cuts: list[tuple[UUID, str, float, float, float]] = []
    for p in windowed:
        if left.get(p.id) is None:
            continue
        roots = [p.spec[name] for name in p.spec.roots]
        for step, b in zip(roots, await task_budgets(tx, p.spec, roots, float(left[p.id])),
                           strict=True):
            if b is not None and b.cut:
                assert b.reserve is not None
                cuts.append((p.id, step.name, b.seconds, b.own, b.reserve))
    if cuts:
        await tx.run(
            "task_cut_deadline_many_if_unclaimed",
            execution_ids=[c[0] for c in cuts], steps=[c[1] for c in cuts],
            seconds=[c[2] for c in cuts], uncuts=[c[3] for c in cuts],
            reserves=[c[4] for c in cuts],
        )


def _traces(chunk: list[Prepared]) -> dict[str, list[str | None] | None]:
    """The ``traceparents``/``tracestates`` parameters: NULL arrays (nothing to send) unless
    some start of the chunk was traced."""
    if all(p.trace is None for p in chunk):
        return {"traceparents": None, "tracestates": None}
    return {
        "traceparents": [None if p.trace is None else p.trace[0] for p in chunk],
        "tracestates": [None if p.trace is None else p.trace[1] for p in chunk],
    }


async def _existing(tx: Tx, taken: list[Prepared]) -> list[UUID]:
    """The executions whose idempotency keys these requests reused, in their order (a new
    statement: it sees the rows that made the insert skip them, committed by others since ours
    began); a different input raises :class:`IdempotencyConflict`."""
    rows = await tx.all(
        "execution_get_by_idempotency_keys",
        workflow_names=[p.spec.name for p in taken],
        idempotency_keys=[p.idempotency_key for p in taken],
    )
    found = {(r["workflow_name"], r["idempotency_key"]): r for r in rows}
    out: list[UUID] = []
    for p in taken:
        row = found.get((p.spec.name, p.idempotency_key))
        if row is None:
            # The row that took the key was deleted between the insert and this read.
            raise KonduitError(
                f"idempotency key {p.idempotency_key!r} of {p.spec.name!r} was in use and is "
                f"gone now (its execution was deleted meanwhile); start it again"
            )
        if row["input_hash"] != tx.io.digest(p.input_hash):
            raise IdempotencyConflict(
                f"idempotency key {p.idempotency_key!r} already started execution "
                f"{row['id']} of {p.spec.name!r} with a different input"
            )
        out.append(UUID(str(row["id"])))
    return out


def requests_of(requests: Iterable[StartRequest | Mapping[str, Any]]) -> list[StartRequest]:
    """The requests as :class:`StartRequest`, each fault named by its index."""
    out: list[StartRequest] = []
    for i, request in enumerate(requests):
        try:
            out.append(StartRequest.of(request))
        except KonduitError as exc:
            raise at_request(i, exc) from exc
        except TypeError as exc:
            raise KonduitError(f"start request {i}: {exc}") from exc
    return out
