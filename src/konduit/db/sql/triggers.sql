-- name: trigger_replace_for_version
-- Registration: the event triggers a workflow version declares now (wf.on_event); those it no
-- longer declares are dropped.
WITH gone AS (
    DELETE FROM konduit_event_triggers
    WHERE workflow_name = %(name)s AND workflow_version = %(version)s
      AND event <> ALL(%(events)s::text[])
)
INSERT INTO konduit_event_triggers (workflow_name, workflow_version, event, spec)
SELECT %(name)s, %(version)s, t.event, t.spec::jsonb
FROM unnest(%(events)s::text[], %(specs)s::text[]) AS t(event, spec)
ON CONFLICT (workflow_name, workflow_version, event) DO UPDATE SET spec = EXCLUDED.spec;

-- name: trigger_list_for_event
-- The triggers an event sent now takes: of each workflow, those of its newest registered
-- version only (as a start by name starts the newest version).
SELECT t.workflow_name, t.workflow_version, t.spec
FROM konduit_event_triggers t
WHERE t.event = %(event)s
  AND t.workflow_version = (SELECT max(w.version) FROM konduit_workflows w
                            WHERE w.name = t.workflow_name)
ORDER BY t.workflow_name;

-- name: trigger_event_insert
-- Record an event a trigger took, pending until a process with the code applies it.
INSERT INTO konduit_trigger_events (workflow_name, workflow_version, event, key, payload)
VALUES (%(workflow_name)s, %(workflow_version)s, %(event)s, %(key)s, %(payload)s::text::jsonb)
RETURNING id, workflow_name, workflow_version, event, key, payload, created_at;

-- name: trigger_event_list_pending
-- Events still to apply, of the workflow versions this worker has the code of (name@version),
-- oldest first. Not locked: each is locked (and re-checked) in its own transaction.
SELECT id
FROM konduit_trigger_events
WHERE status = 'pending'
  AND workflow_name || '@' || workflow_version = ANY(%(workflows)s::text[])
ORDER BY id
LIMIT %(limit)s;

-- name: trigger_event_lock_if_pending
-- One pending event, locked for applying it; none when another worker holds it or applied it.
SELECT id, workflow_name, workflow_version, event, key, payload, created_at
FROM konduit_trigger_events
WHERE id = %(id)s AND status = 'pending'
FOR UPDATE SKIP LOCKED;

-- name: trigger_event_finish_if_pending
-- What an event came to: started (execution_id), gathered (group_id) or failed (error); and
-- the key its trigger's key= computed, if any.
-- sealed: error
UPDATE konduit_trigger_events
SET status = %(status)s, execution_id = %(execution_id)s, group_id = %(group_id)s,
    error = %(error)s, done_at = konduit_clock_timestamp(), key = COALESCE(%(key)s::text, key)
WHERE id = %(id)s AND status = 'pending'
RETURNING id;

-- name: trigger_group_add
-- An event joins the open burst or batch of its key, or opens one. A burst keeps its newest
-- event's input and is due that event's time + the debounce; a batch appends the input and
-- stays due at its first event's time + the window. The row lock of the upsert serializes the
-- events of one key with each other and with the group's start.
INSERT INTO konduit_trigger_groups AS g
    (workflow_name, workflow_version, event, mode, group_key, inputs, size, last_event_at,
     opened_at, due_at)
VALUES (%(workflow_name)s, %(workflow_version)s, %(event)s, %(mode)s, %(group_key)s,
        jsonb_build_array(%(input)s::text::jsonb), 1, %(event_at)s, konduit_clock_timestamp(),
        %(event_at)s::timestamptz + make_interval(secs => %(wait_seconds)s))
ON CONFLICT (workflow_name, event, group_key) DO UPDATE SET
    inputs = CASE WHEN g.mode = 'batch' THEN g.inputs || EXCLUDED.inputs
                  WHEN EXCLUDED.last_event_at >= g.last_event_at THEN EXCLUDED.inputs
                  ELSE g.inputs END,
    size = g.size + 1,
    last_event_at = greatest(g.last_event_at, EXCLUDED.last_event_at),
    due_at = CASE WHEN g.mode = 'batch' THEN g.due_at
                  ELSE greatest(g.due_at, EXCLUDED.due_at) END
RETURNING id, size;

-- name: trigger_group_list_due
-- Bursts and batches whose time came, of the workflow versions this worker serves, oldest
-- first. A group with events of its trigger still pending from before its due time waits for
-- them to be applied (they may belong to it).
SELECT g.id
FROM konduit_trigger_groups g
WHERE g.due_at <= konduit_statement_timestamp()
  AND g.workflow_name || '@' || g.workflow_version = ANY(%(workflows)s::text[])
  AND NOT EXISTS (SELECT 1 FROM konduit_trigger_events e
                  WHERE e.status = 'pending' AND e.workflow_name = g.workflow_name
                    AND e.event = g.event AND e.created_at <= g.due_at)
ORDER BY g.due_at
LIMIT %(limit)s;

-- name: trigger_group_take_if_due
-- Start a burst or batch: delete its group if it is due now (its due time passed, or a batch
-- holds `full` events), re-checked in this statement against the newest version of the row,
-- so an event that moved a burst's due time since it was listed keeps the burst open, and of
-- two workers racing only one deletes it. The execution is created in the same transaction.
DELETE FROM konduit_trigger_groups g
WHERE g.id = %(id)s
  AND ((g.mode = 'batch' AND g.size >= %(full)s::int)
       OR (g.due_at <= konduit_clock_timestamp()
           AND NOT EXISTS (SELECT 1 FROM konduit_trigger_events e
                           WHERE e.status = 'pending' AND e.workflow_name = g.workflow_name
                             AND e.event = g.event AND e.created_at <= g.due_at)))
RETURNING g.id, g.workflow_name, g.workflow_version, g.event, g.mode, g.group_key, g.inputs,
          g.size;

-- name: trigger_event_finish_group
-- The events of a burst or batch that started (execution_id) or could not (failed, error).
-- sealed: error
UPDATE konduit_trigger_events
SET status = %(status)s, execution_id = %(execution_id)s, error = %(error)s
WHERE group_id = %(group_id)s AND status = 'gathered';

-- name: trigger_list_all
-- Every registered event trigger with what it is doing now: open bursts/batches, events
-- pending, and its last event (the workflow page and GET /api/v1/workflows).
SELECT t.workflow_name, t.workflow_version, t.event, t.spec,
       (SELECT count(*) FROM konduit_trigger_groups g
        WHERE g.workflow_name = t.workflow_name AND g.event = t.event)::bigint AS open_groups,
       (SELECT count(*) FROM konduit_trigger_events e
        WHERE e.status = 'pending' AND e.workflow_name = t.workflow_name
          AND e.event = t.event)::bigint AS pending,
       (SELECT e.created_at FROM konduit_trigger_events e
        WHERE e.workflow_name = t.workflow_name AND e.event = t.event
        ORDER BY e.id DESC LIMIT 1) AS last_event_at
FROM konduit_event_triggers t
WHERE %(workflow)s::text IS NULL OR t.workflow_name = %(workflow)s::text
ORDER BY t.workflow_name, t.workflow_version DESC, t.event;

-- name: trigger_event_delete_done_before
-- Retention: events that came to an end (started, alone or in their group; failed) before
-- the cutoff; a pending one, or one whose group is still open, stays. The bound is
-- konduit_statement_timestamp() (stable): an index condition on konduit_trigger_events_done, so a pass
-- with nothing to delete reads nothing.
DELETE FROM konduit_trigger_events ev
WHERE ev.id IN (
    SELECT e.id FROM konduit_trigger_events e
    WHERE e.created_at < konduit_statement_timestamp() - make_interval(secs => %(older_than_seconds)s)
      AND e.status IN ('started', 'failed')
    ORDER BY e.created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
  AND ev.status IN ('started', 'failed');
