-- name: stream_chunk_append_if_leased
-- Append one chunk to a stream (docs/streams.md), while the caller still holds the lease of
-- the attempt writing it: the task row is share-locked in this statement, so a reclaim or an
-- end of the task waits for the write, and a write after them finds the lease gone and adds
-- nothing. The head row gives the offset (its update serializes writers: offsets are dense)
-- and keeps the stream within its bounds; the first write of an attempt other than the one
-- that wrote last also adds a restart record just before its chunk. A (lease_token, seq) that
-- is already stored (the same write sent again after an unanswered try) adds nothing and
-- answers its offset. Returns one row: the chunk's offset (NULL when nothing was added), the
-- restart record's offset, and what the caller needs to say why nothing was added.
WITH held AS (
    SELECT t.id
    FROM konduit_tasks t
    WHERE t.id = %(task_id)s::bigint
      AND konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token,
                                      %(lease_token)s::uuid)
    FOR SHARE OF t
),
already AS (
    SELECT c.chunk_offset
    FROM konduit_stream_chunks c
    WHERE c.execution_id = %(execution_id)s::uuid AND c.name = %(name)s::text
      AND c.writer_token = %(lease_token)s::uuid AND c.seq = %(seq)s::integer
),
head AS (
    INSERT INTO konduit_streams AS s (execution_id, name, step, map_index, next_offset, chunks,
                                      bytes, writer_token, writer_attempt)
    SELECT %(execution_id)s::uuid, %(name)s::text, %(step)s::text, %(map_index)s::integer,
           1, 1, %(bytes)s::bigint, %(lease_token)s::uuid, %(attempt)s::integer
    WHERE EXISTS (SELECT 1 FROM held) AND NOT EXISTS (SELECT 1 FROM already)
      AND %(bytes)s::bigint <= %(max_bytes)s::bigint AND %(max_chunks)s::integer >= 1
    ON CONFLICT (execution_id, name) DO UPDATE
    SET next_offset = s.next_offset + CASE WHEN s.writer_token = EXCLUDED.writer_token
                                           THEN 1 ELSE 2 END,
        chunks = s.chunks + 1,
        bytes = s.bytes + EXCLUDED.bytes,
        restarts = s.restarts + CASE WHEN s.writer_token = EXCLUDED.writer_token
                                     THEN 0 ELSE 1 END,
        marker_offset = CASE WHEN s.writer_token = EXCLUDED.writer_token
                             THEN NULL ELSE s.next_offset END,
        previous_attempt = CASE WHEN s.writer_token = EXCLUDED.writer_token
                                THEN s.previous_attempt ELSE s.writer_attempt END,
        writer_token = EXCLUDED.writer_token,
        writer_attempt = EXCLUDED.writer_attempt,
        updated_at = konduit_clock_timestamp()
    WHERE s.step = EXCLUDED.step AND s.map_index = EXCLUDED.map_index
      AND s.chunks + 1 <= %(max_chunks)s::integer
      AND s.bytes + EXCLUDED.bytes <= %(max_bytes)s::bigint
    RETURNING s.next_offset, s.marker_offset, s.previous_attempt
),
written AS (
    INSERT INTO konduit_stream_chunks (execution_id, name, chunk_offset, kind, attempt,
                                       previous_attempt, writer_token, seq, payload)
    SELECT %(execution_id)s::uuid, %(name)s::text, h.marker_offset, 'restart',
           %(attempt)s::integer, h.previous_attempt, %(lease_token)s::uuid, 0, NULL
    FROM head h WHERE h.marker_offset IS NOT NULL
    UNION ALL
    SELECT %(execution_id)s::uuid, %(name)s::text, h.next_offset - 1, 'data',
           %(attempt)s::integer, NULL, %(lease_token)s::uuid, %(seq)s::integer,
           %(payload)s::jsonb
    FROM head h
    RETURNING chunk_offset, kind
)
SELECT (SELECT w.chunk_offset FROM written w WHERE w.kind = 'data') AS chunk_offset,
       (SELECT w.chunk_offset FROM written w WHERE w.kind = 'restart') AS restart_offset,
       (SELECT a.chunk_offset FROM already a) AS already_offset,
       EXISTS (SELECT 1 FROM held) AS held,
       (SELECT count(pg_notify('konduit_stream', %(execution_id)s::uuid::text)) FROM head) AS notified,
       s.step AS owner_step, s.map_index AS owner_map_index, s.chunks, s.bytes
FROM (SELECT 1) AS one
LEFT JOIN konduit_streams s ON s.execution_id = %(execution_id)s::uuid AND s.name = %(name)s::text;

-- name: stream_chunk_list_from
-- A stream's records from an offset on, in offset order, at most `limit` of them (a primary-key
-- range: what it reads is what it returns).
SELECT c.chunk_offset, c.kind, c.attempt, c.previous_attempt, c.payload,
       c.written_at
FROM konduit_stream_chunks_of(%(execution_id)s::uuid) c
WHERE c.execution_id = %(execution_id)s AND c.name = %(name)s
  AND c.chunk_offset >= %(from_offset)s
ORDER BY c.chunk_offset
LIMIT %(limit)s;

-- name: stream_get_state
-- Where a stream stands, for a reader deciding whether more can come: its head (NULL columns
-- when nothing was written to that name yet), its execution's status, and the status of the
-- newest generation of the task that writes it (NULL when it has none). A stream ends when
-- that task or its execution has ended: every write holds the task's lease, and an ended task
-- holds none.
SELECT e.status AS execution_status, s.name, s.step, s.map_index, s.next_offset, s.chunks,
       s.bytes, s.writer_attempt, s.restarts,
       (SELECT t.status FROM konduit_tasks_of(%(execution_id)s::uuid) t
        WHERE t.execution_id = s.execution_id AND t.step = s.step AND t.map_index = s.map_index
        ORDER BY t.generation DESC LIMIT 1) AS task_status
FROM konduit_executions_of(%(execution_id)s::uuid) e
LEFT JOIN konduit_streams_of(%(execution_id)s::uuid) s ON s.execution_id = e.id AND s.name = %(name)s
WHERE e.id = %(execution_id)s;

-- name: stream_list_of_execution
-- Every stream of an execution, by name: its writer (step, map index, latest attempt), how many
-- data chunks and bytes it keeps, its next offset and how many times an attempt restarted it.
SELECT s.name, s.step, s.map_index, s.next_offset, s.chunks, s.bytes, s.writer_attempt,
       s.restarts, s.created_at, s.updated_at
FROM konduit_streams_of(%(execution_id)s::uuid) s
WHERE s.execution_id = %(execution_id)s
ORDER BY s.name;
