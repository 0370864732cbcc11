"""Bulk operations over a search: cancel or redrive every execution an
:class:`~konduit.core.search.ExecutionFilter` finds (:class:`~konduit.core.requests.BulkRequest`).

The executions are found a page at a time on the primary (``execution_search``, newest first,
each page after the previous one's last ``(created_at, id)``: a status the action changes does
not move an execution across pages), and each page is one batch: ONE short transaction that
locks the page's executions in id order (the global lock order) and cancels or redrives each
through the one path a single cancel (:func:`konduit.engine.finish.stop_execution`) or redrive
(:func:`konduit.engine.repairs.repair_in`) takes. So no lock of a bulk operation is held longer
than its batch, whatever the number of executions, and a batch that meets a deadlock is run
again as a whole (:meth:`konduit.db.database.Database.atomic`).

The page was read before the locks were taken: each action re-checks, under the row lock and in
its own statements, the status it depends on. An execution that changed in between (a running
one that finished before its cancel, a failed one another redrive reopened first) is skipped and
counted by reason, never acted on twice. A dry run reads the same pages and decides by status
alone (whether a redrive finds a step to re-run is only known under the lock).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING
from uuid import UUID

from konduit.core.model import ExecutionStatus
from konduit.core.requests import BulkRequest
from konduit.db.database import Row, Tx
from konduit.engine import limit_keys, waits
from konduit.engine.finish import ChildEnded, stop_execution
from konduit.engine.repairs import REDRIVE_FROM, repair_in
from konduit.engine.search import check_searchable
from konduit.engine.stored import refuse_map_repair_without_code
from konduit.errors import DatabaseError, KonduitError
from konduit.records import BulkResult

if TYPE_CHECKING:
    from konduit.engine.client import Client

CANCEL_FROM = (ExecutionStatus.RUNNING, ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING)
"""The statuses of an execution a cancel applies to."""

Progress = Callable[[BulkResult], Awaitable[None] | None]
"""Told what is done so far after each batch (a job's progress)."""


@dataclass
class _Batch:
    done: list[UUID] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    children: list[ChildEnded] = field(default_factory=list)


async def run_bulk(client: Client, request: BulkRequest, *,
                   progress: Progress | None = None) -> BulkResult:
    """Cancel or redrive every execution ``request.where`` finds, ``request.batch_size`` per
    transaction (see the module's docstring); the counts of what was done."""
    began = time.monotonic()
    applies = CANCEL_FROM if request.action == "cancel" else REDRIVE_FROM
    p = request.where.params()
    check_searchable(client.db, p)  # by input under a codec: refused, never "none found"
    before: tuple[object, object] = (None, None)
    matched = batches = 0
    longest = 0.0
    done: list[UUID] = []
    skipped: Counter[str] = Counter()

    def result() -> BulkResult:
        return BulkResult(action=request.action, dry_run=request.dry_run, matched=matched,
                          done=len(done), skipped=dict(sorted(skipped.items())),
                          batches=batches, seconds=round(time.monotonic() - began, 6),
                          longest_batch_seconds=round(longest, 6), ids=tuple(done))

    while True:
        rows = await client.db.all(
            "execution_search", id_low=p["id_low"], id_high=p["id_high"], id_tail=p["id_tail"],
            idempotency_key=p["idempotency_key"], tags=p["tags"], input=p["input"],
            status=p["status"], workflow_name=p["workflow_name"],
            workflow_version=p["workflow_version"], since=p["since"], until=p["until"],
            fair_key=p["fair_key"], before_at=before[0], before_id=before[1],
            limit=request.batch_size)
        if not rows:
            break
        before = (rows[-1]["created_at"], rows[-1]["id"])
        matched += len(rows)
        targets: list[Row] = []
        for row in rows:
            if row["status"] in applies:
                targets.append(row)
            else:
                skipped[row["status"]] += 1
        if request.dry_run:
            done += [UUID(str(r["id"])) for r in targets]
        elif targets:
            if request.action == "redrive":
                targets = await _with_definitions(client, targets, skipped)
            batch_began = time.monotonic()
            batch = await client.db.atomic(partial(_act, client, request=request, rows=targets))
            longest = max(longest, time.monotonic() - batch_began)
            batches += 1
            done += batch.done
            skipped.update(batch.skipped)
            for child in batch.children:  # a cancelled child: its parent's step, after commit
                await waits.wake_parents(client.db, client.registry, child,
                                         max_payload_bytes=client.max_payload_bytes)
        if progress is not None:
            told = progress(result())
            if told is not None:
                await told
        if len(rows) < request.batch_size:
            break
    return result()


async def _with_definitions(client: Client, rows: list[Row], skipped: Counter[str]) -> list[Row]:
    """The rows whose workflow definition this process can redrive from (its code, else the
    registered definition), each definition read once, before the batch's transaction; the
    others are counted as skipped by the refusal's code."""
    usable: list[Row] = []
    refused: dict[tuple[str, int], str | None] = {}
    for row in rows:
        key = (row["workflow_name"], row["workflow_version"])
        if key not in refused:
            try:
                await client.specs.load(client.db, *key)
                refuse_map_repair_without_code(client.specs, *key)
                refused[key] = None
            except DatabaseError:
                raise
            except KonduitError as exc:
                refused[key] = exc.code
        code = refused[key]
        if code is None:
            usable.append(row)
        else:
            skipped[code] += 1
    return usable


async def _act(client: Client, tx: Tx, *, request: BulkRequest, rows: list[Row]) -> _Batch:
    """One batch, in the caller's transaction: its executions locked in id order, then the rows
    of their max_running keys in key order (:func:`konduit.engine.limit_keys.lock_for_batch`),
    then each cancelled or redriven; one the action no longer applies to is counted by the
    refusal's code. Every refusal comes before its execution's first write, so the batch goes
    on without it."""
    batch = _Batch()
    ids = sorted(UUID(str(r["id"])) for r in rows)
    # Every execution, then every key row (in a start's order), before the first action.
    await limit_keys.lock_for_batch(
        tx, ids, None if request.action == "cancel"
        else lambda name, version: client.specs.get(name, version).max_running)
    for eid in ids:
        try:
            if request.action == "cancel":
                finished = await stop_execution(tx, eid, ExecutionStatus.CANCELLED,
                                                request.reason)
                if finished is None:
                    batch.skipped["not_running"] += 1
                    continue
                if finished.child_ended is not None:
                    batch.children.append(finished.child_ended)
            else:
                await repair_in(tx, client.specs, eid, max_payload_bytes=client.max_payload_bytes,
                                redrive=True)
        except DatabaseError:
            raise
        except KonduitError as exc:
            batch.skipped[exc.code] += 1
            continue
        batch.done.append(eid)
    return batch
