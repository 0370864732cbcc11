-- name: execution_lock
-- Serialize every fan-in decision of one execution (see konduit.engine.completer), with the
-- seconds left in its window for the budgets of the tasks it creates (NULL: none, or a repair).
SELECT id, workflow_name, workflow_version, status, steps_pending, generation,
       CASE WHEN generation = 1
            THEN extract(epoch FROM deadline_at - konduit_clock_timestamp())::float8 END AS window_left_seconds
FROM konduit_executions
WHERE id = %(id)s
FOR NO KEY UPDATE;

-- name: execution_get
-- One execution, whole.
SELECT id, workflow_name, workflow_version, status, input, output, error, idempotency_key,
       steps_pending, deadline_at, timeout_at, generation, output_version, created_at,
       finished_at, tags, run_at, priority, fair_key
FROM konduit_executions
WHERE id = %(id)s;

-- name: execution_get_with_history
-- One execution, whole, where it is: in the hot table or moved into the history (migration
-- 0041; the view's history side is read through each partition's id index). For the reads
-- that show an execution; a write reads execution_get (the hot table) and, finding nothing,
-- asks execution_get_in_history why.
SELECT id, workflow_name, workflow_version, status, input, output, error, idempotency_key,
       steps_pending, deadline_at, timeout_at, generation, output_version, created_at,
       finished_at, tags, run_at, priority, fair_key
FROM konduit_executions_of(%(id)s::uuid)
WHERE id = %(id)s;

-- name: execution_get_in_history
-- An execution moved into the history (no row while it is in the hot table, or unknown): when
-- it finished, with what status, and when it moved (NULL: moved before migration 0042). A
-- write that finds nothing to act on says why with it (ExecutionInHistory).
SELECT id, status, finished_at, history_moved_at AS moved_at
FROM konduit_history_executions
WHERE id = %(id)s;

-- name: execution_finish_if_running
-- End a running execution with its status, output and error. `webhooks`: some webhook is
-- registered, so the caller writes the deliveries in this transaction (webhooks.sql: the outbox).
-- `idempotency_key` names the parent's task when this is a child workflow (konduit-child:<id>):
-- the caller wakes that task after commit, with no statement more for any other execution.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
-- sealed: error
UPDATE konduit_executions
SET status = %(status)s,
    output = %(output)s,
    error = %(error)s,
    steps_pending = %(steps_pending)s,
    output_version = output_version + 1,
    finished_at = konduit_clock_timestamp()
-- A scheduled execution (migration 0024) ends only stopped (cancelled) before its time, as does
-- one pending a slot under max_running (migration 0026). `run_key`: the caller fills its slot.
WHERE id = %(id)s AND status IN ('running', 'scheduled', 'pending')
RETURNING id, output_version, finish_waited, idempotency_key, workflow_name, run_key,
          EXISTS (SELECT FROM konduit_webhook_subscriptions) AS webhooks;

-- name: execution_mark_waited_if_unfinished
-- A client is about to wait for this execution: its finish must notify (see migration 0010).
-- Under the row lock, so a finish in flight is waited for and then seen as finished.
UPDATE konduit_executions
SET finish_waited = true
WHERE id = %(id)s AND status IN ('pending', 'scheduled', 'running') AND NOT finish_waited;

-- name: execution_notify_finished
-- Wake clients waiting on this execution (only sent when one said it waits); delivered when the
-- transaction commits.
SELECT pg_notify('konduit_finished', %(id)s);

-- name: execution_notify_stopped
-- Tell workers that an execution ended with tasks cancelled under them, so they stop those
-- handlers now. A separate channel from konduit_finished: every notification a listening
-- backend receives costs it a transaction, and most executions end with nothing left to stop.
SELECT pg_notify('konduit_stopped', %(id)s);

-- name: execution_list_timed_out
-- Running executions past their hard timeout, oldest first.
SELECT id
FROM konduit_executions
WHERE status = 'running' AND timeout_at < konduit_clock_timestamp()
ORDER BY timeout_at
LIMIT %(limit)s;

-- name: execution_output_insert
-- Keep this finish's output as a version (repairs add versions, earlier ones stay visible); a
-- succeeded degraded one of a workflow with repair_within= arms its automatic repair (due at
-- finished_at + repair_delay, from the registered spec). The execution row is written again only
-- then, or to disarm a repair that a clean finish made needless: never for an ordinary finish.
-- plan: pinned, it runs at every round (or start) and, taking arrays, was re-planned at every run.
WITH o AS (
    INSERT INTO konduit_execution_outputs (execution_id, version, status, output, degraded)
    SELECT e.id, %(version)s, e.status, e.output,
           ARRAY(SELECT s.step FROM konduit_steps s
                 WHERE s.execution_id = e.id AND s.status = 'degraded' ORDER BY s.step)
    FROM konduit_executions e
    WHERE e.id = %(id)s
    RETURNING execution_id, status, degraded
)
UPDATE konduit_executions e
SET auto_repair_due_at = CASE
        WHEN o.status = 'succeeded' AND o.degraded <> '{}' AND w.spec ? 'repair'
        THEN e.finished_at + make_interval(secs => (w.spec->'repair'->>'delay')::float8)
    END
FROM o, konduit_workflows w
WHERE e.id = o.execution_id AND e.auto_repair_at IS NULL
  AND w.name = e.workflow_name AND w.version = e.workflow_version
  AND ((o.status = 'succeeded' AND o.degraded <> '{}' AND w.spec ? 'repair')
       OR e.auto_repair_due_at IS NOT NULL);

-- name: execution_output_list
-- Every output version of one execution, oldest first.
SELECT version, status, output, degraded, created_at
FROM konduit_execution_outputs_of(%(id)s::uuid)
WHERE execution_id = %(id)s
ORDER BY version;

-- name: execution_get_input_if_keys_missing
-- The input of an execution missing keys its start would give it now (started before its
-- workflow had max_running, `run_key`: whether it has it; before those of `steps` were limited
-- per key), read under the caller's lock of it, with what is missing: a repair or redrive
-- computes those keys. No row: nothing missing.
SELECT m.input, m.run_key_missing, m.steps_missing
FROM (SELECT e.input, %(run_key)s AND e.run_key IS NULL AS run_key_missing,
             ARRAY(SELECT s FROM unnest(%(steps)s::text[]) AS s
                   WHERE NOT coalesce(e.limit_keys ? s, false)) AS steps_missing
      FROM konduit_executions e
      WHERE e.id = %(id)s) AS m
WHERE m.run_key_missing OR cardinality(m.steps_missing) > 0;

-- name: execution_reopen_if_finished
-- Repair or redrive: run a finished execution again as a new generation of the steps being
-- re-run, if it still ended in one of the statuses the operation accepts. `run_key`: the key
-- under max_running of one started without (NULL: none); `limit_keys`: the keys of steps
-- limited per key since it started (NULL: none); a key it has is kept, either kind. Under
-- max_running it begins waiting for a slot now: its place among the key's pending executions.
UPDATE konduit_executions
SET status = 'running',
    queued_at = konduit_now(),
    generation = generation + 1,
    steps_pending = %(steps_pending)s,
    error = NULL,
    finished_at = NULL,
    run_key = coalesce(run_key, %(run_key)s::text),
    limit_keys = CASE WHEN %(limit_keys)s::jsonb IS NULL THEN limit_keys
                      ELSE %(limit_keys)s::jsonb || coalesce(limit_keys, '{}'::jsonb) END,
    auto_repair_due_at = NULL  -- re-armed, if need be, when this run finishes
WHERE id = %(id)s
  AND status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
  AND status = ANY(%(from_statuses)s::text[])
RETURNING generation, run_key;

-- name: execution_get_trace_context
-- The W3C trace context an execution was started with (NULL columns when it was not traced);
-- read by a worker that traces, once per execution it runs.
SELECT traceparent, tracestate FROM konduit_executions WHERE id = %(id)s;
