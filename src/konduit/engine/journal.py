"""The journal of durable calls in the database (``konduit_journal``, migration 0037): what
:class:`konduit.core.journal.CallJournal` reads and writes for one attempt.

Every write is fenced by the attempt's lease in its own statement (``journal_record_if_leased``
holds the task row FOR SHARE while it checks), so an attempt that lost its lease records
nothing. The journal is keyed by the task's place (execution, step, map_index), not by its
generation: a redrive or a repair that runs the step again replays what the earlier generation
recorded (that is the point: a finished model request is never paid for twice). A fork is a new
execution and starts with an empty journal. Retention deletes the journal with its execution.
"""

from __future__ import annotations

import asyncio

from konduit.core.journal import CallJournal, Recorded
from konduit.core.model import TaskAttempt
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json, is_sealed
from konduit.db.database import Database


class DatabaseJournal:
    """The :class:`~konduit.core.journal.JournalStore` of one attempt of one task."""

    def __init__(self, db: Database, task: TaskAttempt):
        assert task.lease_token is not None
        self.db = db
        self.task = task

    async def load(self) -> list[Recorded]:
        task = self.task
        rows = await self.db.all("journal_list_by_task", execution_id=task.execution_id,
                                 step=task.step, map_index=task.map_index)
        return [Recorded(r["seq"], r["name"], self._opened(r["result"])) for r in rows]

    async def entry(self, seq: int) -> Recorded | None:
        task = self.task
        found = await self.db.one("journal_get_entry", execution_id=task.execution_id,
                                  step=task.step, map_index=task.map_index, seq=seq)
        return None if found is None else Recorded(found["seq"], found["name"],
                                                   self._opened(found["result"]))

    def _opened(self, text: str) -> str:
        """A recorded result as stored (JSON text, an envelope under a payload codec), as the
        canonical JSON of its value: :class:`~konduit.CodecError` when this process cannot
        open it (the attempt fails; the call is not made again)."""
        io = self.db.io
        if not io.active:
            return text
        value = io.loads(text)
        if is_sealed(value):
            raise io.why_sealed(value)
        return canonical_json(value, what="a recorded call's result")

    async def record(self, entry: Recorded, result_hash: str, duration: float) -> Recorded | None:
        row = await self.db.one(
            "journal_record_if_leased", task_id=self.task.id, lease_token=self.task.lease_token,
            execution_id=self.task.execution_id,  # whose result (a payload store names by it)
            seq=entry.seq, name=entry.name, content_hash=result_hash, result=entry.result,
            attempt=self.task.attempt, duration_seconds=max(0.0, duration))
        if row is not None:
            return entry
        # Nothing recorded: another attempt of the task (a hedge) recorded this position first,
        # or the lease is lost. The recorded entry, if any, is what counts.
        found = await self.entry(entry.seq)
        if found is None or not await self._held():
            return None
        return found

    async def _held(self) -> bool:
        row = await self.db.one("task_is_leased", id=self.task.id,
                                lease_token=self.task.lease_token)
        return row is not None

    async def mark_replayed(self, seqs: list[int]) -> None:
        task = self.task
        await self.db.run("journal_mark_replayed_if_leased", execution_id=task.execution_id,
                          step=task.step, map_index=task.map_index, seqs=seqs,
                          attempt=task.attempt, task_id=task.id, lease_token=task.lease_token)


def journal_for(db: Database, task: TaskAttempt, *, max_bytes: int = DEFAULT_MAX_BYTES,
                hedged_step: bool = False) -> CallJournal | None:
    """The journal of an attempt a worker runs (None for one without a lease).
    ``hedged_step``: the step has ``hedge=``, so the task's other attempt may record calls
    while this one runs (a call is looked up again before it runs live)."""
    if task.lease_token is None:
        return None
    return CallJournal(DatabaseJournal(db, task), step=task.step, map_index=task.map_index,
                       loop=asyncio.get_running_loop(), max_bytes=max_bytes,
                       shared=hedged_step or task.hedged)
