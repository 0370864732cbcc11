-- name: event_lock_keys
-- Serialize the event decisions of the given (name, key) / (name, execution) pairs: an arming
-- that looks for a stored event and a send_event that looks for a waiting task cannot both miss
-- each other. Locks are taken in hash order, so two arms never wait on each other in a cycle.
SELECT count(pg_advisory_xact_lock(h))::int AS locked
FROM (SELECT DISTINCT hashtextextended(k, 7477) AS h
      FROM unnest(%(keys)s::text[]) AS k ORDER BY 1) AS s;

-- name: task_mark_due_if_waiting
-- An event was accepted for a waiting task (before its deadline): it is due now. Whoever wakes
-- it (the sender at once, else a worker's maintenance) completes it with the event's payload,
-- even past the deadline: the deadline sweep leaves a task that became due in time alone.
UPDATE konduit_tasks
SET wait_until = konduit_clock_timestamp()
WHERE id = %(id)s AND status = 'waiting' AND wait_kind = 'event' AND wait_until IS NULL
  AND konduit_deadline_ahead(deadline_at)
RETURNING id;

-- name: task_find_waiting_for_event
-- The oldest task waiting for this event (core.waits.event_matches, in SQL), not yet due and
-- still before its deadline.
SELECT t.id, t.execution_id, t.step, t.map_index, t.attempt, e.workflow_name, e.workflow_version
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.status = 'waiting' AND t.wait_kind = 'event' AND t.wait_event = %(name)s
  AND t.wait_until IS NULL
  AND (%(key)s::text IS NULL OR t.wait_key = %(key)s::text)
  AND (%(execution_id)s::uuid IS NULL OR t.execution_id = %(execution_id)s::uuid)
  AND konduit_deadline_ahead(t.deadline_at)
ORDER BY t.id
LIMIT 1;

-- name: event_find_pending_for_task
-- The oldest stored event a task that starts waiting consumes (core.waits.event_matches), not
-- yet expired. FOR UPDATE: the retention's DELETE (SKIP LOCKED) passes over it meanwhile.
SELECT id, payload
FROM konduit_events
WHERE name = %(name)s AND consumed_at IS NULL
  AND (key IS NULL OR key = %(key)s::text)
  AND (execution_id IS NULL OR execution_id = %(execution_id)s::uuid)
  AND (expires_at IS NULL OR expires_at > konduit_clock_timestamp())
ORDER BY id
LIMIT 1
FOR UPDATE;

-- name: event_consume_if_pending
-- An event is consumed at most once: by this task, if no one took it first and it has not
-- expired meanwhile.
UPDATE konduit_events
SET consumed_by = %(task_id)s, consumed_at = konduit_clock_timestamp()
WHERE id = %(id)s AND consumed_at IS NULL
  AND (expires_at IS NULL OR expires_at > konduit_clock_timestamp())
RETURNING id;

-- name: event_insert
-- Keep an event: pending (consumed_by NULL) or, for the record, the one that woke a task.
INSERT INTO konduit_events (name, key, execution_id, payload, consumed_by, consumed_at)
VALUES (%(name)s, %(key)s, %(execution_id)s, %(payload)s::jsonb, %(consumed_by)s,
        CASE WHEN %(consumed_by)s::bigint IS NULL THEN NULL ELSE konduit_clock_timestamp() END)
RETURNING id;

-- name: event_store_pending
-- Keep an event no task waits for yet, until now + its retention (event_may_be_awaited says
-- which): the first matching task that starts waiting before then consumes it.
INSERT INTO konduit_events (name, key, execution_id, payload, expires_at)
VALUES (%(name)s, %(key)s, %(execution_id)s, %(payload)s::jsonb,
        konduit_clock_timestamp() + make_interval(secs => %(retention_seconds)s))
RETURNING id, expires_at;

-- name: event_kept_until
-- When the newest event of this name, key and execution still kept for a step to come expires
-- (NULL: none is kept): what `konduit send-event` says of an event it stored.
SELECT max(expires_at) AS expires_at
FROM konduit_events
WHERE name = %(name)s AND consumed_at IS NULL
  AND key IS NOT DISTINCT FROM %(key)s
  AND execution_id IS NOT DISTINCT FROM %(execution_id)s;

-- name: event_payload_consumed_by
-- The payload of the event a task consumed (a due event step woken by maintenance).
SELECT name, payload FROM konduit_events WHERE consumed_by = %(task_id)s;

-- name: event_may_be_awaited
-- Could a task still start waiting for this event, and for how long is it kept? A step that may
-- take it: an event step of this name in a registered workflow version (keyed, when the event
-- names a key: a step without key= is reached by execution id only). Named by execution id, it
-- must be the step of that pending, scheduled or running execution, not yet waiting nor ended;
-- named by key only, a step of any registered version may take it, in an execution running or
-- not started yet. Kept for the longest retention= those steps declare (one declaring none
-- counts the sender's default). Nothing possible: "no match", and nothing is kept.
WITH steps AS (
    SELECT w.name, w.version, s.step ->> 'name' AS step,
           coalesce((s.step -> 'wait' ->> 'retention')::float8,
                    %(default_retention_seconds)s::float8) AS retention
    FROM konduit_workflows w
    CROSS JOIN LATERAL jsonb_array_elements(w.spec -> 'steps') AS s(step)
    WHERE s.step -> 'wait' ->> 'kind' = 'event' AND s.step -> 'wait' ->> 'event' = %(name)s
      AND (%(key)s::text IS NULL OR (s.step -> 'wait' ->> 'keyed')::boolean)
), takers AS (
    SELECT st.retention
    FROM steps st
    WHERE %(execution_id)s::uuid IS NULL
    UNION ALL
    SELECT st.retention
    FROM steps st
    JOIN konduit_executions e
      ON e.workflow_name = st.name AND e.workflow_version = st.version
     AND e.status IN ('pending', 'scheduled', 'running')
    WHERE e.id = %(execution_id)s::uuid
      AND NOT EXISTS (
          SELECT 1 FROM konduit_tasks t
          WHERE t.execution_id = e.id AND t.step = st.step
            AND t.generation = e.generation AND t.status NOT IN ('ready', 'running'))
)
SELECT count(*) > 0 AS possible, max(retention) AS retention_seconds FROM takers;

-- name: task_list_waits_due
-- Waiting tasks the engine should wake now: timers due and events accepted (wait_until passed),
-- and child workflows whose child execution ended. Each half reads its own partial index
-- (konduit_tasks_waiting_until, konduit_tasks_waiting_child), never the ready backlog: the bound
-- is konduit_statement_timestamp(), not konduit_clock_timestamp(), so that it is an index condition (a volatile
-- one would be a filter over every waiting task). The wake re-checks each task in its own write.
SELECT * FROM (
-- A waiting task holds no lease (lease_token is NULL: konduit_tasks' CHECK on status).
(SELECT {{claimed_row}},
        0.0::float8 AS deadline_remaining, false AS hedged,
        extract(epoch FROM konduit_clock_timestamp() - t.fallback_started_at)::float8 AS fallback_age,
        t.wait_kind, t.wait_child,
        NULL::text AS child_status, NULL::jsonb AS child_output, NULL::text AS child_error
 FROM konduit_tasks t
 JOIN konduit_executions e ON e.id = t.execution_id
 WHERE t.status = 'waiting' AND t.wait_until <= konduit_statement_timestamp() AND e.status = 'running'
 ORDER BY t.wait_until
 LIMIT %(limit)s)
UNION ALL
(SELECT {{claimed_row}},
        0.0::float8, false,
        extract(epoch FROM konduit_clock_timestamp() - t.fallback_started_at)::float8,
        t.wait_kind, t.wait_child,
        c.status, c.output, c.error
 FROM konduit_tasks t
 JOIN konduit_executions c ON c.id = t.wait_child
 JOIN konduit_executions e ON e.id = t.execution_id
 WHERE t.status = 'waiting' AND t.wait_kind = 'child' AND c.status NOT IN ('pending', 'running')
   AND e.status = 'running'
 LIMIT %(limit)s)
) AS due;

-- name: task_get_waiting_for_child_if_ended
-- The prompt wake of one child-workflow step, right after its child's finish committed: the
-- task, in task_list_waits_due's shape, if it still waits for that very child (not woken,
-- expired or cancelled meanwhile; and a user's key that only looks like a child's names no
-- task waiting for this execution) and its execution runs. The wake itself is fenced again.
SELECT {{claimed_row}},
       0.0::float8 AS deadline_remaining, false AS hedged,
       extract(epoch FROM konduit_clock_timestamp() - t.fallback_started_at)::float8 AS fallback_age,
       t.wait_kind, t.wait_child,
       c.status AS child_status, c.output AS child_output, c.error AS child_error
FROM konduit_tasks t
JOIN konduit_executions c ON c.id = t.wait_child
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.id = %(id)s AND t.wait_child = %(child)s AND t.wait_kind = 'child'
  AND t.status = 'waiting' AND c.status NOT IN ('pending', 'running') AND e.status = 'running';

-- name: execution_children_running
-- The running child executions of an execution's child-workflow steps, in id order (the lock
-- order of several executions), for a cancel that goes down the tree.
SELECT c.id
FROM konduit_tasks t
JOIN konduit_executions c ON c.id = t.wait_child
WHERE t.execution_id = %(execution_id)s AND t.wait_kind = 'child' AND c.status = 'running'
ORDER BY c.id;

-- name: execution_parent_of
-- The execution (and step) whose child-workflow step started this execution, if any: in the
-- hot tables or the history (a parent ends after its child began, so only the history's days
-- from the one before this execution's id was made: konduit_tasks_since, migration 0047).
SELECT t.execution_id, t.step
FROM konduit_tasks_since(konduit_history_from(%(execution_id)s::uuid)) t
WHERE t.wait_child = %(execution_id)s AND t.wait_kind = 'child'
LIMIT 1;

-- name: task_count_waiting
-- Waiting tasks by what they wait for (metrics).
SELECT wait_kind AS kind, count(*)::bigint AS tasks
FROM konduit_tasks
WHERE status = 'waiting'
GROUP BY wait_kind
ORDER BY wait_kind;

-- name: execution_children_list
-- The child executions an execution's child-workflow steps started, with their status (the
-- execution page links them): in the hot tables or the history. The execution and its
-- children began when its id was made or later, so only the history's days from the one
-- before (konduit_<table>_since, migration 0047).
-- Each child is looked up by its id (a lateral read: a probe of each side's id index).
SELECT t.step, c.id, c.status, c.workflow_name
FROM konduit_tasks_since(konduit_history_from(%(execution_id)s::uuid)) t
CROSS JOIN LATERAL (
    SELECT x.id, x.status, x.workflow_name
    FROM konduit_executions_since(konduit_history_from(%(execution_id)s::uuid)) x
    WHERE x.id = t.wait_child
    LIMIT 1) c
WHERE t.execution_id = %(execution_id)s AND t.wait_kind = 'child'
ORDER BY t.id;

-- name: event_delete_before
-- Retention: a batch of events sent before the cutoff, consumed or never taken, except one
-- whose task still waits to be woken with its payload, and one an execution took that is
-- still kept (running, holding a dead letter, or in the history): an event sent to an
-- execution by id and taken by it (a person's answer: who answered, what, when) is that
-- execution's record and goes when the execution is gone, not before. SKIP LOCKED passes
-- over an event being consumed right now; the outer WHERE re-checks in this statement what
-- the batch was chosen by.
DELETE FROM konduit_events ev
WHERE ev.id IN (
    SELECT e.id FROM konduit_events e
    WHERE e.created_at < konduit_clock_timestamp() - make_interval(secs => %(older_than_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM konduit_tasks t
                      WHERE t.id = e.consumed_by AND t.status = 'waiting')
      AND NOT (e.execution_id IS NOT NULL AND e.consumed_by IS NOT NULL
               AND EXISTS (SELECT 1
                           FROM konduit_executions_since(konduit_history_from(e.execution_id)) x
                           WHERE x.id = e.execution_id))
    ORDER BY e.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
  AND ev.created_at < konduit_clock_timestamp() - make_interval(secs => %(older_than_seconds)s)
  AND NOT EXISTS (SELECT 1 FROM konduit_tasks t
                  WHERE t.id = ev.consumed_by AND t.status = 'waiting')
  AND NOT (ev.execution_id IS NOT NULL AND ev.consumed_by IS NOT NULL
           AND EXISTS (SELECT 1
                       FROM konduit_executions_since(konduit_history_from(ev.execution_id)) x
                       WHERE x.id = ev.execution_id));

-- name: event_delete_expired
-- A batch of stored events past their retention, never consumed (nor ever to be: a consume
-- re-checks expires_at). The batch is read on konduit_events_expiring with konduit_statement_timestamp()
-- as its index condition (a volatile konduit_clock_timestamp() would filter every pending event, each
-- worker's waits pass); SKIP LOCKED passes over one an arming holds; the outer WHERE re-checks
-- in this statement what the batch was chosen by.
DELETE FROM konduit_events ev
WHERE ev.id IN (
    SELECT e.id FROM konduit_events e
    WHERE e.consumed_at IS NULL AND e.expires_at IS NOT NULL
      AND e.expires_at <= konduit_statement_timestamp()
    ORDER BY e.expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
  AND ev.consumed_at IS NULL AND ev.expires_at <= konduit_clock_timestamp();

-- name: event_count_stored
-- Stored events not yet consumed nor expired, by name (konduit stats, the metrics).
SELECT name, count(*)::bigint AS events, min(expires_at) AS next_expiry
FROM konduit_events
WHERE consumed_at IS NULL AND (expires_at IS NULL OR expires_at > konduit_clock_timestamp())
GROUP BY name
ORDER BY name;

-- name: task_get_for_answer
-- The current task of an execution's step, with its execution's state, for an answer to a
-- wait_for_input step: whether it waits still (not yet due, before its deadline).
SELECT e.status AS execution_status, e.workflow_name, e.workflow_version,
       t.id, t.status, t.wait_kind, t.wait_event, t.wait_until,
       t.id IS NOT NULL AND konduit_deadline_ahead(t.deadline_at) AS before_deadline
FROM konduit_executions e
LEFT JOIN konduit_tasks t
  ON t.execution_id = e.id AND t.step = %(step)s AND t.generation = e.generation
WHERE e.id = %(execution_id)s
ORDER BY t.map_index
LIMIT 1;

-- name: task_list_waiting_for_input
-- The inbox: every wait_for_input step waiting for its answer (not yet answered, before its
-- deadline), oldest first, with what its registered step says (its JSON Schema, who may
-- answer). Read through konduit_tasks_waiting_event (waiting event tasks only); the prefix is
-- tested with starts_with, not a range, which a non-C collation would order otherwise.
SELECT t.execution_id, e.workflow_name, e.workflow_version, t.step,
       t.started_at AS waiting_since, t.deadline_at,
       s.step -> 'wait' -> 'input' ->> 'who' AS who,
       s.step -> 'wait' -> 'input' -> 'schema' AS schema
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
JOIN konduit_workflows w ON w.name = e.workflow_name AND w.version = e.workflow_version
CROSS JOIN LATERAL (
    SELECT st AS step FROM jsonb_array_elements(w.spec -> 'steps') AS st
    WHERE st ->> 'name' = t.step LIMIT 1) s
WHERE t.status = 'waiting' AND t.wait_kind = 'event'
  AND starts_with(t.wait_event, 'konduit-input:')
  AND t.wait_until IS NULL AND konduit_deadline_ahead(t.deadline_at)
  AND (%(execution_id)s::uuid IS NULL OR t.execution_id = %(execution_id)s::uuid)
ORDER BY t.started_at, t.id
LIMIT %(limit)s;

-- name: event_list_answers_by_execution
-- The answers given to an execution's wait_for_input steps: who answered each and when (the
-- moment its event was taken), oldest first; of an execution moved into the history too (its
-- events stay where they are: retention keeps them as long as the execution, event_delete_before).
-- The event's payload whole ({value, answered_by}): under a payload codec it is one sealed
-- envelope, opened where it is read (Answer.from_event_row), not picked apart here.
SELECT t.execution_id, t.step, t.generation, ev.payload, ev.consumed_at AS answered_at
FROM konduit_tasks_of(%(execution_id)s::uuid) t
JOIN konduit_events ev ON ev.consumed_by = t.id
WHERE t.execution_id = %(execution_id)s
  AND starts_with(ev.name, 'konduit-input:')
ORDER BY ev.consumed_at, t.id;

-- name: event_list_payload_models
-- The payload models (JSON Schemas) declared for event `name`, which a sender checks the payload
-- against before sending: those of the event steps (wait_for_event payload=) of the named
-- execution's workflow version (of every registered version when no execution is named; keyed
-- ones only when the event names a key), then those of the on_event triggers of that name
-- (step NULL). Workflows and triggers are definitions: a few rows whatever the history.
SELECT w.name AS workflow_name, w.version AS workflow_version, s.step ->> 'name' AS step,
       s.step -> 'wait' -> 'payload' AS schema
FROM konduit_workflows w
CROSS JOIN LATERAL jsonb_array_elements(w.spec -> 'steps') AS s(step)
WHERE s.step -> 'wait' ->> 'kind' = 'event' AND s.step -> 'wait' ->> 'event' = %(name)s
  AND s.step -> 'wait' ? 'payload'
  AND (%(key)s::text IS NULL OR %(execution_id)s::uuid IS NOT NULL
       OR (s.step -> 'wait' ->> 'keyed')::boolean)
  AND (%(execution_id)s::uuid IS NULL
       OR (w.name, w.version) = (SELECT e.workflow_name, e.workflow_version
                                 FROM konduit_executions e WHERE e.id = %(execution_id)s::uuid))
UNION ALL
SELECT t.workflow_name, t.workflow_version, NULL, t.spec -> 'payload'
FROM konduit_event_triggers t
WHERE t.event = %(name)s AND t.spec ? 'payload'
ORDER BY 1, 2, 3;
