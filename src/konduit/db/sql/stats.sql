-- name: step_attempt_stats_by_workflow
-- Per step of recent executions of every workflow (or one): attempt durations, tries, outcomes, last success.
WITH recent AS (
    SELECT id, workflow_name, created_at
    FROM konduit_executions
    WHERE (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s::text)
      AND created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
), tries AS (
    SELECT r.workflow_name, t.step,
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.finished_at - a.started_at)::float8)
               FILTER (WHERE a.outcome = 'succeeded') AS p50,
           percentile_cont(0.95) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.finished_at - a.started_at)::float8)
               FILTER (WHERE a.outcome = 'succeeded') AS p95,
           percentile_cont(0.99) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.finished_at - a.started_at)::float8)
               FILTER (WHERE a.outcome = 'succeeded') AS p99,
           count(*) FILTER (WHERE a.outcome = 'succeeded') AS succeeded_attempts,
           count(*) FILTER (WHERE a.outcome IS DISTINCT FROM 'released') AS attempts,
           count(*) FILTER (WHERE a.outcome = 'retry') AS retries,
           count(*) FILTER (WHERE a.outcome = 'lost') AS lost,
           count(*) FILTER (WHERE a.hedge) AS hedges,
           -- A hedge won when its attempt ended the task (an outcome of the task itself).
           count(*) FILTER (WHERE a.hedge AND a.outcome IN ('succeeded', 'degraded', 'timed_out',
                                                             'failed')) AS hedges_won,
           max(a.finished_at) FILTER (WHERE a.outcome = 'succeeded') AS last_success_at
    FROM recent r
    JOIN konduit_tasks t ON t.execution_id = r.id
    JOIN konduit_attempts a ON a.task_id = t.id
    GROUP BY r.workflow_name, t.step
), outcomes AS (
    SELECT r.workflow_name, s.step,
           count(*) AS executions,
           count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE s.status = 'degraded') AS degraded,
           count(*) FILTER (WHERE s.status = 'failed') AS failed,
           count(*) FILTER (WHERE s.status = 'timed_out') AS timed_out,
           count(*) FILTER (WHERE s.status = 'skipped') AS skipped,
           count(*) FILTER (WHERE s.status = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE s.status IN ('waiting', 'active')) AS unfinished,
           avg(extract(epoch FROM s.fired_at - r.created_at)::float8) AS fired_after
    FROM recent r
    JOIN konduit_steps s ON s.execution_id = r.id
    GROUP BY r.workflow_name, s.step
)
SELECT o.workflow_name, o.step, o.executions, o.succeeded, o.degraded, o.failed, o.timed_out,
       o.skipped, o.cancelled, o.unfinished,
       t.p50, t.p95, t.p99,
       COALESCE(t.succeeded_attempts, 0) AS succeeded_attempts,
       COALESCE(t.attempts, 0) AS attempts,
       COALESCE(t.retries, 0) AS retries,
       COALESCE(t.lost, 0) AS lost,
       COALESCE(t.hedges, 0) AS hedges,
       COALESCE(t.hedges_won, 0) AS hedges_won,
       t.last_success_at,
       extract(epoch FROM konduit_clock_timestamp() - t.last_success_at)::float8 AS since_last_success
FROM outcomes o
LEFT JOIN tries t ON t.workflow_name = o.workflow_name AND t.step = o.step
ORDER BY o.workflow_name, o.fired_after NULLS LAST, o.step;

-- name: step_join_stats_by_workflow
-- Per join (a step with two upstreams or more) of recent executions: fan-in wait, dispatch latency, stragglers.
WITH fired AS (
    SELECT e.workflow_name, s.step, s.straggler,
           extract(epoch FROM s.fired_at - s.first_upstream_at)::float8 AS wait,
           extract(epoch FROM s.fired_at - s.last_upstream_at)::float8 AS dispatch
    FROM konduit_executions e
    JOIN konduit_steps s ON s.execution_id = e.id
    WHERE (%(workflow_name)s::text IS NULL OR e.workflow_name = %(workflow_name)s::text)
      AND e.created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
      AND s.up_total >= 2
      AND s.fired_at IS NOT NULL
      AND s.first_upstream_at IS NOT NULL
), stragglers AS (
    SELECT workflow_name, step, jsonb_object_agg(straggler, times) AS stragglers
    FROM (SELECT workflow_name, step, straggler, count(*) AS times
          FROM fired
          WHERE straggler IS NOT NULL
          GROUP BY workflow_name, step, straggler) counted
    GROUP BY workflow_name, step
)
SELECT f.workflow_name, f.step,
       count(*) AS samples,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY f.wait) AS wait_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY f.wait) AS wait_p95,
       max(f.wait) AS wait_max,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY f.dispatch) AS dispatch_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY f.dispatch) AS dispatch_p95,
       COALESCE(st.stragglers, '{}'::jsonb) AS stragglers
FROM fired f
LEFT JOIN stragglers st ON st.workflow_name = f.workflow_name AND st.step = f.step
GROUP BY f.workflow_name, f.step, st.stragglers
ORDER BY f.workflow_name, f.step;

-- name: step_join_waits_recent
-- The last fan-in waits of each join, oldest first: fired ones, and waits still open past the
-- threshold; with when each step of the execution ended, in seconds after the join's first
-- branch did (NULL: not yet), to tell a straggler from a durable wait (core/fan_in.py).
WITH waits AS (
    SELECT e.workflow_name, e.workflow_version, s.step, e.id AS execution_id, e.created_at,
           s.straggler, s.first_upstream_at,
           s.fired_at IS NULL AS waiting,
           extract(epoch FROM COALESCE(s.fired_at, konduit_clock_timestamp()) - s.first_upstream_at)::float8
               AS wait,
           row_number() OVER (PARTITION BY e.workflow_name, s.step
                              ORDER BY e.created_at DESC, e.id DESC) AS newest
    FROM konduit_executions e
    JOIN konduit_steps s ON s.execution_id = e.id
    WHERE (%(workflow_name)s::text IS NULL OR e.workflow_name = %(workflow_name)s::text)
      AND e.created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
      AND s.up_total >= 2
      AND s.first_upstream_at IS NOT NULL
      AND (s.fired_at IS NOT NULL
           OR (e.status = 'running' AND s.status = 'waiting'
               AND konduit_clock_timestamp() - s.first_upstream_at
                   > make_interval(secs => %(threshold_seconds)s)))
)
SELECT w.workflow_name, w.workflow_version, w.step, w.execution_id, w.created_at, w.straggler,
       w.waiting, w.wait,
       (SELECT jsonb_object_agg(u.step,
                                extract(epoch FROM u.ended_at - w.first_upstream_at)::float8)
        FROM konduit_steps u WHERE u.execution_id = w.execution_id) AS ends
FROM waits w
WHERE w.newest <= %(per_join)s
ORDER BY w.workflow_name, w.step, w.created_at, w.execution_id;
