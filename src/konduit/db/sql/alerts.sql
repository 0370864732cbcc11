-- name: execution_list_running_with_window
-- Running first runs (not repairs) that have a window (deadline_at), soonest first, with the
-- server's time, and the first branch whose window-cut budget could not keep it (its budget and
-- its reserve overrun the time the window had when its task was made: its fallback ran at
-- once). A map's items share one budget: item 0 stands for them (a bounded read).
SELECT e.id, e.workflow_name, e.workflow_version, e.deadline_at, e.created_at,
       u.step AS unkeepable_step, u.reserve AS unkeepable_reserve,
       u.window_left AS unkeepable_window_left,
       konduit_clock_timestamp() AS now
FROM konduit_executions e
LEFT JOIN LATERAL (
    SELECT t.step, t.deadline_reserve_seconds AS reserve,
           extract(epoch FROM e.deadline_at - t.created_at)::float8 AS window_left
    FROM konduit_tasks t
    WHERE t.execution_id = e.id
      AND t.generation = e.generation
      AND t.map_index = 0
      AND t.deadline_reserve_seconds IS NOT NULL
      AND t.deadline_seconds + t.deadline_reserve_seconds
          > extract(epoch FROM e.deadline_at - t.created_at)
    ORDER BY t.created_at, t.id
    LIMIT 1
) u ON true
WHERE e.status = 'running'
  AND e.deadline_at IS NOT NULL
  AND e.generation = 1
ORDER BY e.deadline_at, e.id
LIMIT %(limit)s;

-- name: step_list_progress_for_executions
-- Where each step of some executions stands: status, when its join fired, when it ended.
SELECT execution_id, step, status, fired_at, ended_at
FROM konduit_steps
WHERE execution_id = ANY(%(execution_ids)s::uuid[]);

-- name: execution_get_window_outcome
-- How an execution with a window stands now (to word the resolution of its window alert).
SELECT id, status, generation, deadline_at, finished_at, konduit_clock_timestamp() AS now
FROM konduit_executions
WHERE id = %(id)s;

-- name: workflow_last_success_for_names
-- Per workflow name: when it was first registered and when its latest succeeded execution finished.
SELECT w.name,
       (SELECT min(r.created_at) FROM konduit_workflows r WHERE r.name = w.name) AS registered_at,
       last.finished_at AS last_success_at,
       konduit_clock_timestamp() AS now
FROM unnest(%(names)s::text[]) AS w(name)
LEFT JOIN LATERAL (
    SELECT e.finished_at
    FROM konduit_executions e
    WHERE e.workflow_name = w.name
      AND e.status = 'succeeded'
    ORDER BY e.created_at DESC
    LIMIT 1
) last ON true;

-- name: workflow_degraded_share_for_names
-- Per workflow (all when names is NULL): executions that finished within the window (succeeded,
-- failed or timed out; a repair's finish counts its execution once) and how many of them went
-- out degraded at least once (an output version with degraded steps, even if repaired since),
-- those read through the partial index of degraded output versions (a repair follows its
-- degraded output within a window or so: older degraded versions are not looked for).
-- plan: custom, a day of executions: from none to millions (a plan made on a tiny table would scan).
WITH finished AS (
    SELECT e.workflow_name AS name, count(*)::int AS finished
    FROM konduit_executions e
    WHERE e.finished_at > konduit_clock_timestamp() - make_interval(secs => %(window_seconds)s)
      AND e.status IN ('succeeded', 'failed', 'timed_out')
      AND (%(names)s::text[] IS NULL OR e.workflow_name = ANY(%(names)s::text[]))
    GROUP BY e.workflow_name
), degraded AS (
    SELECT e.workflow_name AS name, count(DISTINCT e.id)::int AS degraded
    FROM konduit_execution_outputs o
    JOIN konduit_executions e ON e.id = o.execution_id
    WHERE o.degraded <> '{}'
      AND o.created_at > konduit_now() - make_interval(secs => 2 * %(window_seconds)s)
      AND e.finished_at > konduit_clock_timestamp() - make_interval(secs => %(window_seconds)s)
      AND e.status IN ('succeeded', 'failed', 'timed_out')
      AND (%(names)s::text[] IS NULL OR e.workflow_name = ANY(%(names)s::text[]))
    GROUP BY e.workflow_name
)
SELECT f.name, f.finished, COALESCE(d.degraded, 0) AS degraded
FROM finished f
LEFT JOIN degraded d ON d.name = f.name
ORDER BY f.name;

-- name: task_queue_list_unserved
-- Ready work that no live worker takes: per queue and workflow version (name@version) with due
-- ready tasks, when some live worker serves the version (else it is version_unserved's) but none
-- of those serves the queue. Since when (the later of the last moment a worker serving both was
-- heard from and the oldest due task of a sample), the due ready tasks (counted up to 1000) and
-- some of their executions. The pairs come from a loose scan of konduit_tasks_ready (one index
-- probe per pair with ready work, however deep a backlog), each unserved pair's sample from the
-- same index; konduit_workers is a small table (retention forgets silent workers).
WITH RECURSIVE pairs AS (
    (SELECT t.queue, t.workflow FROM konduit_tasks t
     WHERE t.status = 'ready'
     ORDER BY t.queue, t.workflow LIMIT 1)
    UNION ALL
    SELECT n.queue, n.workflow
    FROM pairs p
    CROSS JOIN LATERAL (
        SELECT t.queue, t.workflow FROM konduit_tasks t
        WHERE t.status = 'ready' AND (t.queue, t.workflow) > (p.queue, p.workflow)
        ORDER BY t.queue, t.workflow LIMIT 1) n
), workers AS MATERIALIZED (
    SELECT k.queues, k.workflows, coalesce(k.stopped_at, k.last_heartbeat_at) AS seen_at,
           (k.stopped_at IS NULL AND k.last_heartbeat_at
                > konduit_clock_timestamp() - make_interval(secs => k.lease_seconds)) AS live
    FROM konduit_workers k
), unserved AS (
    SELECT p.queue, p.workflow,
           (SELECT max(w.seen_at) FROM workers w
            WHERE p.queue = ANY(w.queues) AND p.workflow = ANY(w.workflows)) AS last_served_at
    FROM pairs p
    WHERE NOT EXISTS (SELECT 1 FROM workers w
                      WHERE w.live AND p.queue = ANY(w.queues) AND p.workflow = ANY(w.workflows))
      AND EXISTS (SELECT 1 FROM workers w WHERE w.live AND p.workflow = ANY(w.workflows))
)
SELECT u.queue, u.workflow, s.ready, s.executions,
       extract(epoch FROM konduit_clock_timestamp() - greatest(u.last_served_at, s.oldest_at))::float8
           AS unserved_seconds
FROM unserved u
CROSS JOIN LATERAL (
    SELECT count(*) AS ready, min(d.run_at) AS oldest_at,
           (array_agg(DISTINCT d.execution_id))[1:5] AS executions
    FROM (SELECT t.execution_id, t.run_at FROM konduit_tasks t
          WHERE t.status = 'ready' AND t.queue = u.queue AND t.workflow = u.workflow
            AND t.run_at <= konduit_clock_timestamp()
          LIMIT 1000) d
) s
WHERE s.ready > 0
ORDER BY u.queue, u.workflow;

-- name: alert_get_clock
-- The server's time: the moment an evaluation reads its data (guards its raises and resolutions).
SELECT konduit_clock_timestamp() AS now;

-- name: alert_raise_or_confirm_unless_resolved_since
-- Open the alert, or refresh the open one; not if resolved after as_of, nor for an execution no
-- longer in its first run, nor for a queue (of a workflow version) that a live worker takes now.
INSERT INTO konduit_alerts AS a (kind, subject, workflow, severity, message, details,
                                 raised_at, last_seen_at)
SELECT %(kind)s, %(subject)s, %(workflow)s, %(severity)s, %(message)s, %(details)s,
       konduit_clock_timestamp(), konduit_clock_timestamp()
WHERE NOT EXISTS (
        SELECT 1 FROM konduit_alerts c
        WHERE c.kind = %(kind)s AND c.subject = %(subject)s AND c.resolved_at >= %(as_of)s)
  AND (%(execution_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM konduit_executions e
        WHERE e.id = %(execution_id)s::uuid AND e.status = 'running' AND e.generation = 1))
  AND (%(queue)s::text IS NULL OR NOT EXISTS (
        SELECT 1 FROM konduit_workers k
        WHERE k.stopped_at IS NULL
          AND k.last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => k.lease_seconds)
          AND %(queue)s::text = ANY(k.queues) AND %(queue_workflow)s::text = ANY(k.workflows)))
ON CONFLICT (kind, subject) WHERE resolved_at IS NULL
DO UPDATE SET severity = EXCLUDED.severity,
              message = EXCLUDED.message,
              details = EXCLUDED.details,
              last_seen_at = greatest(a.last_seen_at, EXCLUDED.last_seen_at)
RETURNING a.id, a.kind, a.subject, a.workflow, a.severity, a.message, a.details,
          a.raised_at, a.last_seen_at, a.resolved_at, (a.xmax = 0) AS raised;

-- name: alert_resolve_if_open_and_unconfirmed_since
-- Resolve the open alert of (kind, subject) unless an evaluation newer than as_of confirmed it.
UPDATE konduit_alerts
SET resolved_at = greatest(konduit_clock_timestamp(), raised_at),
    details = details || %(resolution)s
WHERE kind = %(kind)s
  AND subject = %(subject)s
  AND resolved_at IS NULL
  AND last_seen_at <= %(as_of)s
RETURNING id, kind, subject, workflow, severity, message, details,
          raised_at, last_seen_at, resolved_at;

-- name: alert_list_open_for_workflows
-- The open alerts of some workflows (the ones an evaluation may resolve).
SELECT id, kind, subject, workflow, severity, message, details,
       raised_at, last_seen_at, resolved_at
FROM konduit_alerts
WHERE resolved_at IS NULL
  AND workflow = ANY(%(workflows)s::text[])
ORDER BY raised_at, id;

-- name: alert_list_recent
-- Alerts newest first: open ones only, or resolved ones too; optionally of one kind or workflow.
SELECT id, kind, subject, workflow, severity, message, details,
       raised_at, last_seen_at, resolved_at
FROM konduit_alerts
WHERE (%(include_resolved)s OR resolved_at IS NULL)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
ORDER BY raised_at DESC, id DESC
LIMIT %(limit)s;

-- name: alert_count_open_by_kind
-- Open alerts per kind (the exporter's konduit_alerts_open).
SELECT kind, count(*) AS open
FROM konduit_alerts
WHERE resolved_at IS NULL
GROUP BY kind
ORDER BY kind;

-- name: alert_delete_resolved_before
-- Retention: delete a batch of alerts resolved before the cutoff (open ones are never deleted).
DELETE FROM konduit_alerts
WHERE id IN (
    SELECT id FROM konduit_alerts
    WHERE resolved_at < konduit_clock_timestamp() - make_interval(secs => %(older_than_seconds)s)
    ORDER BY id
    LIMIT %(limit)s
)
  AND resolved_at < konduit_clock_timestamp() - make_interval(secs => %(older_than_seconds)s);
