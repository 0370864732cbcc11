-- The stall watchdog (konduit.engine.stalls): running executions in which nothing can run.
--
-- Cost on a big database. The look runs on every maintenance pass of every worker, so it never
-- reads in proportion to the database nor to an execution's tasks:
--   * it walks the running executions only (the partial index konduit_executions_running_id),
--     a bounded window of them per pass in id order after a cursor (a keyset, never OFFSET), so
--     a pass reads at most %(window)s execution rows however many run;
--   * "has it a task that can run?" is one probe of the partial index konduit_tasks_live (only
--     unfinished tasks are in it): a map of 100,000 finished items costs one index lookup, not
--     100,000 rows;
--   * "did a step move within the grace?" reads the execution's step rows by primary key
--     prefix: one row per step of the workflow, never per task;
--   * an execution with an open stall alert is skipped (one probe of konduit_alerts_open), so an
--     undecidable stall is diagnosed once, not re-read on every pass.
-- Only an execution found stalled is read whole (task_count_latest_by_step_and_status), once.

-- name: execution_list_stalled_after_cursor
-- A window of running executions after a cursor (id order) and those of it that look stalled: no ready, running or waiting task, no map items waiting in chunks, no step moved within the grace, no open stall alert.
WITH scanned AS MATERIALIZED (
    SELECT e.id, e.workflow_name, e.workflow_version, e.created_at
    FROM konduit_executions e
    WHERE e.status = 'running'
      AND e.id > COALESCE(%(after)s::uuid, '00000000-0000-0000-0000-000000000000'::uuid)
    ORDER BY e.id
    LIMIT %(window)s
)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT s.id FROM scanned s ORDER BY s.id DESC LIMIT 1) AS last_id,
       c.id, c.workflow_name, c.workflow_version
FROM (VALUES (true)) AS one (x)
LEFT JOIN LATERAL (
    SELECT s.id, s.workflow_name, s.workflow_version
    FROM scanned s
    WHERE s.created_at < konduit_clock_timestamp() - make_interval(secs => %(grace_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM konduit_tasks t
                      WHERE t.execution_id = s.id AND t.status IN ('ready', 'running', 'waiting'))
      -- Items still to be created from a map's chunks (migration 0032) are work to come.
      AND NOT EXISTS (SELECT 1 FROM konduit_map_chunks c WHERE c.execution_id = s.id)
      AND NOT EXISTS (SELECT 1 FROM konduit_steps st
                      WHERE st.execution_id = s.id
                        AND greatest(st.fired_at, st.ended_at)
                            >= konduit_clock_timestamp() - make_interval(secs => %(grace_seconds)s))
      AND NOT EXISTS (SELECT 1 FROM konduit_alerts a
                      WHERE a.kind = 'execution_stalled' AND a.subject = s.id::text
                        AND a.resolved_at IS NULL)
    ORDER BY s.id
    LIMIT %(limit)s
) c ON true;

-- name: execution_get_stall
-- Under the execution lock: its status, whether a task of it can run, and when a step of it last moved (the stall re-checked in the deciding transaction).
SELECT e.id, e.status, e.workflow_name, e.workflow_version, e.generation, e.created_at,
       EXISTS (SELECT 1 FROM konduit_tasks t
               WHERE t.execution_id = e.id AND t.status IN ('ready', 'running', 'waiting'))
       OR EXISTS (SELECT 1 FROM konduit_map_chunks c
                  WHERE c.execution_id = e.id AND c.generation = e.generation) AS live,
       (SELECT max(greatest(st.fired_at, st.ended_at)) FROM konduit_steps st
        WHERE st.execution_id = e.id) AS moved_at,
       konduit_clock_timestamp() AS now
FROM konduit_executions e
WHERE e.id = %(id)s;

-- name: task_count_latest_by_step_and_status
-- A stalled execution's tasks of its current generation by step, status and routes, with their last end (read once per stall, under the execution lock).
SELECT t.step, t.status, t.routes, count(*) AS tasks, max(t.finished_at) AS finished_at
FROM konduit_tasks t
WHERE t.execution_id = %(execution_id)s
  AND t.generation = %(generation)s
GROUP BY t.step, t.status, t.routes
ORDER BY t.step, t.status;

-- name: alert_raise_stall_unless_open
-- Open the execution_stalled alert of an execution (under its lock); nothing when one is open already.
INSERT INTO konduit_alerts (kind, subject, workflow, severity, message, details)
VALUES ('execution_stalled', %(subject)s, %(workflow)s, %(severity)s, %(message)s, %(details)s)
ON CONFLICT (kind, subject) WHERE resolved_at IS NULL DO NOTHING
RETURNING id, kind, subject, workflow, severity, message, details,
          raised_at, last_seen_at, resolved_at;

-- name: alert_resolve_stall_if_open
-- Resolve the open execution_stalled alert of an execution the fan-in decision just healed (under its lock).
UPDATE konduit_alerts
SET resolved_at = greatest(konduit_clock_timestamp(), raised_at),
    details = details || %(resolution)s
WHERE kind = 'execution_stalled'
  AND subject = %(subject)s
  AND resolved_at IS NULL
RETURNING id, kind, subject, workflow, severity, message, details,
          raised_at, last_seen_at, resolved_at;

-- name: alert_resolve_stalls_if_execution_moved
-- Resolve the open stall alerts (oldest first, a bounded batch) whose execution ended, is gone, or has a task that can run again, re-checked in this statement.
UPDATE konduit_alerts a
SET resolved_at = greatest(konduit_clock_timestamp(), a.raised_at),
    details = a.details || jsonb_build_object('resolution', CASE
        WHEN e.id IS NULL THEN 'execution no longer exists'
        WHEN e.status <> 'running' THEN 'execution ' || e.status
        ELSE 'a task of the execution can run again' END)
FROM (
    SELECT o.id,
           CASE WHEN o.subject ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN o.subject::uuid END AS execution_id
    FROM konduit_alerts o
    WHERE o.kind = 'execution_stalled' AND o.resolved_at IS NULL
    ORDER BY o.raised_at, o.id
    LIMIT %(limit)s
) AS open
LEFT JOIN konduit_executions e ON e.id = open.execution_id
WHERE a.id = open.id
  AND a.resolved_at IS NULL
  AND (e.id IS NULL OR e.status <> 'running'
       OR EXISTS (SELECT 1 FROM konduit_tasks t
                  WHERE t.execution_id = e.id AND t.status IN ('ready', 'running', 'waiting')))
RETURNING a.id, a.kind, a.subject, a.workflow, a.severity, a.message, a.details,
          a.raised_at, a.last_seen_at, a.resolved_at;

-- name: alert_get_open_stall_for_execution
-- The open execution_stalled alert of one execution, if any (status pages say it is stalled and why).
SELECT id, kind, subject, workflow, severity, message, details,
       raised_at, last_seen_at, resolved_at
FROM konduit_alerts
WHERE kind = 'execution_stalled'
  AND subject = %(subject)s
  AND resolved_at IS NULL;

-- name: execution_stall_count_increment
-- Count one stall found (konduit_stalls_total), in the transaction that recorded its alert.
INSERT INTO konduit_stalls AS s (workflow, healed, stalls)
VALUES (%(workflow)s, %(healed)s, 1)
ON CONFLICT (workflow, healed) DO UPDATE SET stalls = s.stalls + 1;

-- name: execution_stall_count_by_workflow
-- Stalls found so far, per workflow and whether the fan-in decision healed them (the exporter's konduit_stalls_total).
SELECT workflow, healed, stalls
FROM konduit_stalls
ORDER BY workflow, healed;
