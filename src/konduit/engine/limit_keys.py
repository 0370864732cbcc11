"""Per-key limits in the database (migration 0026): the keys of new executions, admission under
``Workflow(max_running=N, key=...)``, and the maintenance of key rows.

Admission is race-free by one lock per (workflow, key): a start creates and locks its key's row,
then counts the key's running executions in its next statement (a snapshot taken after the lock
was granted) and leaves the executions past the limit ``pending``; a finish of one of the key's
running executions locks the same row in its own transaction and starts the oldest pending
ones (:func:`fill_after_finish`); the maintenance pass does the same for any key it finds with
pending executions (:func:`maintain`), so a missed fill only waits for the next pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from konduit.db.database import Database, Tx


@dataclass(frozen=True)
class KeyedStart:
    """A new execution with keys: its id, workflow, its steps' keys and its max_running key."""

    id: UUID
    workflow_name: str
    limit_keys: dict[str, str] | None
    run_key: str | None
    max_running: int | None


async def store_and_admit(tx: Tx, starts: Sequence[KeyedStart]) -> list[UUID]:
    """Store the keys of new executions and hold those past their key's ``max_running`` as
    ``pending``; returns the held ones. In the starting transaction, after the insert."""
    if not starts:
        return []
    await tx.run(
        "execution_set_limit_keys_many",
        ids=[s.id for s in starts],
        limit_keys=[None if s.limit_keys is None else json.dumps(s.limit_keys) for s in starts],
        run_keys=[s.run_key for s in starts],
    )
    runs = [s for s in starts if s.run_key is not None and s.max_running is not None]
    if not runs:
        return []
    await tx.run("execution_lock_run_slots_many", workflow_names=[s.workflow_name for s in runs],
                 keys=[s.run_key for s in runs], max_runnings=[s.max_running for s in runs])
    row = await tx.one("execution_hold_many_over_max_running", ids=[s.id for s in runs],
                       workflow_names=[s.workflow_name for s in runs],
                       run_keys=[s.run_key for s in runs])
    return [] if row is None else [UUID(str(i)) for i in row["held"]]


async def admit_reopened(tx: Tx, execution_id: UUID, workflow_name: str, key: str,
                         max_running: int) -> bool:
    """A finished execution of ``key`` was reopened running in ``tx`` (a repair, a redrive):
    it takes a slot like a new start, so under the key's row lock (created again when idle
    keys' rows were retired) it is held ``pending`` when its key has no free slot or older
    pending executions, its new ready tasks set aside until a slot frees. Returns whether it
    was held."""
    await tx.run("execution_lock_run_slots_many", workflow_names=[workflow_name], keys=[key],
                 max_runnings=[max_running])
    row = await tx.one("execution_hold_many_over_max_running", ids=[execution_id],
                       workflow_names=[workflow_name], run_keys=[key])
    return row is not None and bool(row["held"])


async def lock_for_batch(tx: Tx, ids: Sequence[UUID],
                         max_running: Callable[[str, int], int | None] | None) -> None:
    """Lock a batch of executions (a bulk cancel or redrive) in id order, then the rows of
    their max_running keys in the order a start locks them (workflow, key), before the caller
    acts on any of them: each finish (its fill) or reopen (its admission) of the batch then
    finds its key's row already held. Acting first locked a key's row per execution, in id
    order: a batch crossing keys b then a held b while it waited for a, which a start of a and
    b held while it waited for b (a deadlock, one side run again). With ``max_running`` (the
    workflow's limit by name and version: a redrive takes a slot) a missing row is made, as
    the reopen's admission would make it; without (a cancel: only a row's fill) only rows
    that exist are locked."""
    locked = await tx.all("execution_lock_many_with_run_keys", ids=list(ids))
    keyed = [r for r in locked if r["run_key"] is not None]
    if max_running is None:
        if keyed:
            await tx.all("execution_lock_run_slots_existing",
                         workflow_names=[r["workflow_name"] for r in keyed],
                         keys=[r["run_key"] for r in keyed])
        return
    limits = [(r, max_running(r["workflow_name"], r["workflow_version"])) for r in keyed]
    limited = [(r, n) for r, n in limits if n is not None]
    if limited:
        await tx.run("execution_lock_run_slots_many",
                     workflow_names=[r["workflow_name"] for r, _ in limited],
                     keys=[r["run_key"] for r, _ in limited],
                     max_runnings=[n for _, n in limited])


async def fill_after_finish(tx: Tx, workflow_name: str, key: str) -> list[UUID]:
    """An execution of ``key`` ended in ``tx``: lock the key's row and start its oldest
    pending executions into the freed slots (committed with the finish)."""
    if await tx.one("execution_lock_run_slot", workflow_name=workflow_name, key=key) is None:
        return []
    return await _fill(tx, [workflow_name], [key])


async def _fill(tx: Tx, names: list[str], keys: list[str]) -> list[UUID]:
    row = await tx.one("execution_start_pending_in_run_slots", workflow_names=names, keys=keys)
    return [] if row is None else [UUID(str(i)) for i in row["started"]]


@dataclass(frozen=True)
class KeysKept:
    """What one maintenance pass did: executions started into free slots, key rows retired."""

    started: int = 0
    retired: int = 0


async def maintain(db: Database, *, limit: int = 100, idle_seconds: float = 60.0) -> KeysKept:
    """Start pending executions of keys with free slots (up to ``limit`` keys), and retire the
    rows of idle keys (up to ``limit`` * 10 of each kind) so that keys cost storage only while
    they have work."""

    async def fill(tx: Tx) -> int:
        locked = await tx.all("execution_lock_run_slots_pending", limit=limit)
        if not locked:
            return 0
        return len(await _fill(tx, [r["workflow_name"] for r in locked],
                               [r["key"] for r in locked]))

    started = await db.atomic(fill)
    flows = await db.one("flow_limit_delete_idle_keys", idle_seconds=idle_seconds, limit=limit * 10)
    slots = await db.all("execution_delete_idle_run_slots", idle_seconds=idle_seconds, limit=limit * 10)
    return KeysKept(started, (0 if flows is None else int(flows["deleted"])) + len(slots))
