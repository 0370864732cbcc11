-- name: workflow_version_list_with_service
-- Every registered workflow version (or those of one name): its running executions, the live
-- workers serving it, and since when its running executions have had no live worker (NULL while
-- one serves it or none runs): the later of the last moment a worker serving it was alive and
-- its oldest running execution's start.
-- plan: custom: it counts the running executions, which grow with the backlog.
WITH running AS (
    SELECT e.workflow_name, e.workflow_version, count(*) AS running,
           min(e.created_at) AS oldest_running_at
    FROM konduit_executions e
    WHERE e.status = 'running'
      AND (%(name)s::text IS NULL OR e.workflow_name = %(name)s::text)
    GROUP BY e.workflow_name, e.workflow_version
), served AS (
    SELECT w.name, w.version,
           coalesce(array_agg(k.id ORDER BY k.id) FILTER (
               WHERE k.stopped_at IS NULL
                 AND k.last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => k.lease_seconds)),
               '{}') AS workers,
           max(coalesce(k.stopped_at, k.last_heartbeat_at)) AS last_served_at
    FROM konduit_workflows w
    LEFT JOIN konduit_workers k ON (w.name || '@' || w.version) = ANY(k.workflows)
    WHERE %(name)s::text IS NULL OR w.name = %(name)s::text
    GROUP BY w.name, w.version
)
SELECT w.name, w.version, w.policy_revision, w.created_at, w.policy_updated_at,
       coalesce(r.running, 0) AS running, s.workers, s.last_served_at,
       CASE WHEN r.running > 0 AND cardinality(s.workers) = 0
            THEN greatest(s.last_served_at, r.oldest_running_at) END AS unserved_since,
       CASE WHEN r.running > 0 AND cardinality(s.workers) = 0
            THEN extract(epoch FROM konduit_clock_timestamp()
                         - greatest(s.last_served_at, r.oldest_running_at))::float8
            END AS unserved_seconds
FROM konduit_workflows w
JOIN served s ON s.name = w.name AND s.version = w.version
LEFT JOIN running r ON r.workflow_name = w.name AND r.workflow_version = w.version
WHERE %(name)s::text IS NULL OR w.name = %(name)s::text
ORDER BY w.name, w.version;

-- name: task_policy_list_by_execution
-- The policy each task of an execution was created with, grouped (a map's items share one row
-- per policy): what it stores (tries, budget, queue, priority) and the revision of its version's
-- policy its creator applied (a task from before migration 0022: the revision in effect then).
-- plan: custom: it reads every task of the execution, a map's too.
SELECT t.step, t.generation, count(*) AS tasks, min(t.map_index) AS first_index,
       t.max_attempts, t.deadline_seconds, t.queue, t.priority,
       coalesce(t.policy_revision, r.revision) AS policy_revision,
       min(t.created_at) AS created_at
FROM konduit_tasks_of(%(execution_id)s::uuid) t
JOIN konduit_executions_of(%(execution_id)s::uuid) e ON e.id = t.execution_id
LEFT JOIN LATERAL (
    SELECT p.revision FROM konduit_workflow_policies p
    WHERE t.policy_revision IS NULL
      AND p.name = e.workflow_name AND p.version = e.workflow_version
      AND p.created_at <= t.created_at
    ORDER BY p.revision DESC LIMIT 1) r ON true
WHERE t.execution_id = %(execution_id)s
GROUP BY t.step, t.generation, t.max_attempts, t.deadline_seconds, t.queue, t.priority,
         coalesce(t.policy_revision, r.revision)
ORDER BY min(t.id);

-- name: execution_list_unserved_by_ids
-- Which of these executions are running under a version no live worker serves (the list marks
-- them, the execution page says so).
SELECT e.id
FROM konduit_executions e
WHERE e.id = ANY(%(ids)s::uuid[]) AND e.status = 'running'
  AND NOT EXISTS (
      SELECT 1 FROM konduit_workers k
      WHERE k.stopped_at IS NULL
        AND k.last_heartbeat_at > konduit_clock_timestamp() - make_interval(secs => k.lease_seconds)
        AND (e.workflow_name || '@' || e.workflow_version) = ANY(k.workflows));

-- name: workflow_policy_get
-- One policy revision of a workflow version: its whole stored definition (a worker reads the
-- retry backoff a task was created with from it).
SELECT revision, spec
FROM konduit_workflow_policies
WHERE name = %(name)s AND version = %(version)s AND revision = %(revision)s;
