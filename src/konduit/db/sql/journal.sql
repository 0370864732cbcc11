-- The journal of durable calls inside a step (ctx.call, docs/journal.md; migration 0037).

-- name: journal_list_by_task
-- The recorded calls of one task's place (execution, step, map_index: every generation and
-- attempt shares it), in call order, each with its result as JSON text.
SELECT j.seq, j.name, r.result::text AS result
FROM konduit_journal j
JOIN konduit_journal_results r
    ON r.execution_id = j.execution_id AND r.content_hash = j.content_hash
WHERE j.execution_id = %(execution_id)s AND j.step = %(step)s AND j.map_index = %(map_index)s
ORDER BY j.seq;

-- name: journal_get_entry
-- One recorded call of a task's place, with its result as JSON text: what another attempt of
-- the task (a hedge, or the straggler it hedges) recorded at that position, first or since this
-- attempt read the journal.
SELECT j.seq, j.name, r.result::text AS result
FROM konduit_journal j
JOIN konduit_journal_results r
    ON r.execution_id = j.execution_id AND r.content_hash = j.content_hash
WHERE j.execution_id = %(execution_id)s AND j.step = %(step)s AND j.map_index = %(map_index)s
  AND j.seq = %(seq)s;

-- name: journal_record_if_leased
-- Record one live call's result, only while the caller still holds the task's lease (its lease
-- or its hedge's): the check is this statement's, and FOR SHARE holds the task row until the
-- record commits, so a rescue or a deadline sweep that ends the attempt either committed first
-- (and nothing is recorded) or waits for the record. The result is stored once per execution
-- under its hash; a position another attempt recorded first is left as it is (nothing is
-- returned then, as when the lease is lost: journal_get_entry tells the two apart).
WITH held AS (
    SELECT t.execution_id, t.step, t.map_index, t.generation
    FROM konduit_tasks t
    WHERE t.id = %(task_id)s AND t.execution_id = %(execution_id)s
      AND konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token, %(lease_token)s)
    FOR SHARE OF t
), stored AS (
    INSERT INTO konduit_journal_results (execution_id, content_hash, result)
    SELECT h.execution_id, %(content_hash)s, %(result)s::jsonb
    FROM held h
    ON CONFLICT DO NOTHING
)
INSERT INTO konduit_journal (execution_id, step, map_index, seq, name, content_hash, generation,
                             attempt, lease_token, duration_seconds)
SELECT h.execution_id, h.step, h.map_index, %(seq)s, %(name)s, %(content_hash)s, h.generation,
       %(attempt)s, %(lease_token)s, %(duration_seconds)s
FROM held h
ON CONFLICT (execution_id, step, map_index, seq) DO NOTHING
RETURNING seq;

-- name: journal_mark_replayed_if_leased
-- Count a replay of some recorded calls of a task's place (their positions), by an attempt that
-- still holds the task's lease (checked in this statement): what the execution page shows as
-- replayed.
UPDATE konduit_journal j
SET replays = j.replays + 1,
    last_replayed_attempt = %(attempt)s,
    last_replayed_at = konduit_clock_timestamp()
WHERE j.execution_id = %(execution_id)s AND j.step = %(step)s AND j.map_index = %(map_index)s
  AND j.seq = ANY(%(seqs)s::integer[])
  AND EXISTS (SELECT 1 FROM konduit_tasks t
              WHERE t.id = %(task_id)s
                AND konduit_lease_or_hedge_held(t.status, t.lease_token, t.hedge_token,
                                                %(lease_token)s));

-- name: journal_list_by_execution
-- Every recorded call of one execution, by step, item and position: its name, the attempt (and
-- generation) that made it live, how long it took, its result's size and how often later
-- attempts replayed it. Under a payload codec or store (%(sealed)s) the result column holds an
-- envelope, whose size is not the result's: its text comes too, for the reader to measure
-- (as text: a reference to a payload store is not followed).
-- plan: custom, as many rows as the execution recorded calls (a map: every item's).
SELECT j.step, j.map_index, j.seq, j.name, j.generation, j.attempt, j.duration_seconds,
       j.recorded_at, j.replays, j.last_replayed_attempt, j.last_replayed_at, j.content_hash,
       octet_length(r.result::text) AS result_bytes,
       CASE WHEN %(sealed)s::boolean THEN r.result::text END AS result_text
FROM konduit_journal_of(%(execution_id)s::uuid) j
JOIN konduit_journal_results_of(%(execution_id)s::uuid) r
    ON r.execution_id = j.execution_id AND r.content_hash = j.content_hash
WHERE j.execution_id = %(execution_id)s
ORDER BY j.step, j.map_index, j.seq
LIMIT %(limit)s;
