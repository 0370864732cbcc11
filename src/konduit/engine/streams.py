"""Durable streams in the database (docs/streams.md): appending a chunk under the writer's lease,
reading a stream from an offset, and following it live.

A stream is keyed by (execution, name) and written by one task (:mod:`konduit.core.streams`
names it). Offsets are dense from 0. A write is one statement
(``stream_chunk_append_if_leased``) that checks the attempt's lease, gives the offset, keeps the
stream within its bounds and adds a restart record when another attempt wrote last; a write
sent again after an unanswered try (same lease, same ``seq``) is stored once. Readers wake on
``NOTIFY konduit_stream`` (payload: the execution's id) and poll as a fallback.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

from konduit.core.model import TaskAttempt
from konduit.core.streams import decode_chunk
from konduit.db.database import Database, Row, translate_errors
from konduit.errors import (
    DatabaseUnavailable,
    ExecutionNotFound,
    StreamError,
    StreamFull,
    StreamLeaseLost,
    StreamNotFound,
)
from konduit.records import StreamChunk, StreamRecord

log = logging.getLogger(__name__)

FINISHED_TASK = frozenset({"succeeded", "degraded", "timed_out", "failed", "cancelled", "skipped"})
FINISHED_EXECUTION = frozenset({"succeeded", "failed", "timed_out", "cancelled"})

READ_BATCH = 500
"""Records read per statement while following a stream."""

POLL_SECONDS = 1.0
"""How long a follower waits for a notification before it reads again anyway."""

SEND_TRIES = 5
"""Tries of one write whose answer was lost (the database went away): the same write again is
stored once, so trying again is safe."""


@dataclass(frozen=True)
class StreamLimits:
    """A stream's bounds: data chunks and bytes of chunk JSON it keeps at most."""

    max_chunks: int
    max_bytes: int


async def append(db: Database, task: TaskAttempt, *, name: str, seq: int, payload_json: str,
                 limits: StreamLimits) -> int:
    """Store one chunk of ``task``'s attempt in stream ``name`` and return its offset; raise
    :class:`StreamLeaseLost`, :class:`StreamFull` or :class:`StreamError` (the name is another
    task's) when nothing was stored. A write whose answer was lost is sent again (stored once)."""
    if task.lease_token is None:
        raise StreamLeaseLost(f"step {task.step!r} has no lease to write stream {name!r} with",
                              step=task.step, stream=name, attempt=task.attempt)
    size = len(payload_json.encode())
    for tried in range(1, SEND_TRIES + 1):
        try:
            row = await db.one(
                "stream_chunk_append_if_leased", task_id=task.id, lease_token=task.lease_token,
                execution_id=task.execution_id, name=name, step=task.step,
                map_index=task.map_index, attempt=task.attempt, seq=seq, bytes=size,
                payload=payload_json, max_chunks=limits.max_chunks, max_bytes=limits.max_bytes)
            break
        except DatabaseUnavailable:
            if tried == SEND_TRIES:
                raise
            log.info("stream %r: the database did not answer a write; sending it again", name)
            await asyncio.sleep(0.2 * 2 ** tried)
    assert row is not None  # the statement always answers one row
    return _offset_or_refusal(row, task, name, size, limits)


def _offset_or_refusal(row: Row, task: TaskAttempt, name: str, size: int,
                       limits: StreamLimits) -> int:
    if row["chunk_offset"] is not None:
        return int(row["chunk_offset"])
    if row["already_offset"] is not None:
        return int(row["already_offset"])
    where = f"stream {name!r} of step {task.step!r}"
    if not row["held"]:
        raise StreamLeaseLost(
            f"{where}: attempt {task.attempt} no longer holds its task's lease (the task was "
            "reclaimed, ended or cancelled); the chunk was not written",
            step=task.step, stream=name, attempt=task.attempt)
    if row["owner_step"] is not None and (row["owner_step"], row["owner_map_index"]) != (
            task.step, task.map_index):
        raise StreamError(
            f"{where}: the name belongs to step {row['owner_step']!r} (map index "
            f"{row['owner_map_index']}), which wrote it first; a stream has one writer",
            step=task.step, stream=name)
    chunks = int(row["chunks"] or 0)
    if chunks + 1 > limits.max_chunks:
        raise StreamFull(
            f"{where} is full: {chunks} chunks, the limit is {limits.max_chunks} "
            "(KONDUIT_STREAM_MAX_CHUNKS)",
            step=task.step, stream=name, limit="chunks", maximum=limits.max_chunks)
    kept = int(row["bytes"] or 0)
    raise StreamFull(
        f"{where} is full: {kept} bytes kept and a chunk of {size} bytes, the limit is "
        f"{limits.max_bytes} bytes (KONDUIT_STREAM_MAX_BYTES)",
        step=task.step, stream=name, limit="bytes", maximum=limits.max_bytes)


def _chunk(name: str, row: Row) -> StreamChunk:
    return StreamChunk(stream=name, offset=int(row["chunk_offset"]), kind=row["kind"],
                       attempt=int(row["attempt"]), previous_attempt=row["previous_attempt"],
                       data=decode_chunk(row["kind"], row["payload"]), written_at=row["written_at"])


async def streams_of(db: Database, execution_id: UUID) -> builtins.list[StreamRecord]:
    """Every stream of an execution, by name."""
    return [StreamRecord.from_row(r)
            for r in await db.all("stream_list_of_execution", execution_id=execution_id)]


async def read(db: Database, execution_id: UUID, name: str, *, from_offset: int = 0,
               limit: int = READ_BATCH) -> builtins.list[StreamChunk]:
    """At most ``limit`` records of a stream from ``from_offset`` on, in order."""
    rows = await db.all("stream_chunk_list_from", execution_id=execution_id, name=name,
                        from_offset=from_offset, limit=limit)
    return [_chunk(name, r) for r in rows]


async def choose(db: Database, execution_id: UUID, name: str | None) -> str | None:
    """The stream a reader means: ``name``, or the execution's only stream when None (None
    while it has none yet). Raises :class:`StreamNotFound` when several exist and no name
    was given."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise StreamNotFound(f"a stream's name must be a non-empty text, not {name!r}",
                                 stream=None)
        return name
    names = [s.name for s in await streams_of(db, execution_id)]
    if len(names) > 1:
        raise StreamNotFound(
            f"execution {execution_id} has {len(names)} streams ({', '.join(names)}): say "
            "which one with name=", names=names)
    return names[0] if names else None


async def follow(db: Database, execution_id: UUID, name: str | None = None, *,
                 from_offset: int = 0, live: bool = True,
                 poll_seconds: float = POLL_SECONDS) -> AsyncIterator[StreamChunk]:
    """The records of a stream from ``from_offset`` on, in order, each once. With ``live``
    it then waits for more until the stream ends (its task or its execution ended: nothing
    can write it then) and yields them as they are stored; without, it stops at the end of
    what is stored now. ``name`` None is the execution's only stream (with ``live``, the
    first one written when it has none yet)."""
    if isinstance(from_offset, bool) or not isinstance(from_offset, int) or from_offset < 0:
        raise StreamError(f"from_offset must be a whole number >= 0, not {from_offset!r}")
    conn = await db.listen_connection() if live else None
    try:
        if conn is not None:
            with translate_errors():
                await conn.execute("LISTEN konduit_stream")
        offset = from_offset
        chosen = await choose(db, execution_id, name)
        while True:
            # The state first, then the records: a stream seen ended here has every record
            # already committed (each write holds the task's lease, an ended task none).
            state = await db.one("stream_get_state", execution_id=execution_id,
                                 name=chosen or "")
            if state is None:
                raise ExecutionNotFound(f"no execution with id {execution_id}")
            ended = (state["execution_status"] in FINISHED_EXECUTION
                     or state["task_status"] in FINISHED_TASK)
            got = 0
            if chosen is not None:
                while True:
                    batch = await read(db, execution_id, chosen, from_offset=offset)
                    for chunk in batch:
                        yield chunk
                        offset = chunk.offset + 1
                    got += len(batch)
                    if len(batch) < READ_BATCH:
                        break
            if not live or ended:
                return
            if got:
                continue
            if chosen is None:
                chosen = await choose(db, execution_id, name)
                if chosen is not None:
                    continue
            assert conn is not None
            with translate_errors():
                # Notifications of this execution's streams wake it at once; the timeout is
                # the polling fallback (a LISTEN behind a transaction pooler hears nothing).
                async for note in conn.notifies(timeout=poll_seconds):
                    if note.payload == str(execution_id):
                        break
    finally:
        if conn is not None:
            await conn.close()
