-- fragment: execution_recent_with_history
-- Recent executions of every workflow (or one), created in the last history_seconds, of the hot
-- table (history_finished_at NULL) and of the history (migration 0041: with history_after= a
-- nightly pipeline's runs are mostly there). A day of the history that ended before the
-- window began cannot hold an execution created in it: its partitions are pruned. A row's
-- steps, tasks and attempts are then read on its own side, the history's in its own day.
SELECT id, workflow_name, workflow_version, status, created_at,
       NULL::timestamptz AS history_finished_at
FROM konduit_executions
WHERE (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s::text)
  AND created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
UNION ALL
SELECT id, workflow_name, workflow_version, status, created_at, history_finished_at
FROM konduit_history_executions
WHERE (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s::text)
  AND created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
  AND history_finished_at > konduit_now() - make_interval(secs => %(history_seconds)s)

-- fragment: step_of_recent_execution
-- The steps of the executions of `recent` (execution_recent_with_history), each on its side.
SELECT r.id AS execution_id, r.workflow_name, r.workflow_version, r.status AS execution_status,
       r.created_at, r.history_finished_at, s.step, s.status, s.fired_at, s.ended_at,
       s.up_total, s.first_upstream_at, s.last_upstream_at, s.straggler
FROM recent r
JOIN konduit_steps s ON s.execution_id = r.id
WHERE r.history_finished_at IS NULL
UNION ALL
SELECT r.id, r.workflow_name, r.workflow_version, r.status, r.created_at,
       r.history_finished_at, s.step, s.status, s.fired_at, s.ended_at, s.up_total,
       s.first_upstream_at, s.last_upstream_at, s.straggler
FROM recent r
JOIN konduit_history_steps s
  ON s.execution_id = r.id AND s.history_finished_at = r.history_finished_at

-- name: step_attempt_stats_by_workflow
-- Per step of recent executions of every workflow (or one), of the hot tables and the history
-- alike: attempt durations, tries, outcomes, last success.
WITH recent AS (
    {{execution_recent_with_history}}
), tried AS (
    SELECT r.workflow_name, t.step, a.outcome, a.started_at, a.finished_at, a.hedge
    FROM recent r
    JOIN konduit_tasks t ON t.execution_id = r.id
    JOIN konduit_attempts a ON a.task_id = t.id
    WHERE r.history_finished_at IS NULL
    UNION ALL
    SELECT r.workflow_name, t.step, a.outcome, a.started_at, a.finished_at, a.hedge
    FROM recent r
    JOIN konduit_history_tasks t
      ON t.execution_id = r.id AND t.history_finished_at = r.history_finished_at
    JOIN konduit_history_attempts a
      ON a.task_id = t.id AND a.history_finished_at = r.history_finished_at
), stepped AS (
    {{step_of_recent_execution}}
), tries AS (
    SELECT a.workflow_name, a.step,
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
    FROM tried a
    GROUP BY a.workflow_name, a.step
), outcomes AS (
    SELECT s.workflow_name, s.step,
           count(*) AS executions,
           count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE s.status = 'degraded') AS degraded,
           count(*) FILTER (WHERE s.status = 'failed') AS failed,
           count(*) FILTER (WHERE s.status = 'timed_out') AS timed_out,
           count(*) FILTER (WHERE s.status = 'skipped') AS skipped,
           count(*) FILTER (WHERE s.status = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE s.status IN ('waiting', 'active')) AS unfinished,
           avg(extract(epoch FROM s.fired_at - s.created_at)::float8) AS fired_after
    FROM stepped s
    GROUP BY s.workflow_name, s.step
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
-- Per join (a step with two upstreams or more) of recent executions, of the hot tables and the
-- history alike: fan-in wait, dispatch latency, stragglers.
WITH recent AS (
    {{execution_recent_with_history}}
), fired AS (
    SELECT s.workflow_name, s.step, s.straggler,
           extract(epoch FROM s.fired_at - s.first_upstream_at)::float8 AS wait,
           extract(epoch FROM s.fired_at - s.last_upstream_at)::float8 AS dispatch
    FROM ({{step_of_recent_execution}}) s
    WHERE s.up_total >= 2
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
-- branch did (NULL: not yet), to tell a straggler from a durable wait (core/fan_in.py). The hot
-- tables and the history alike (an open wait is in the hot tables only: its execution runs).
WITH recent AS (
    {{execution_recent_with_history}}
), waits AS (
    SELECT s.workflow_name, s.workflow_version, s.step, s.execution_id, s.created_at,
           s.history_finished_at, s.straggler, s.first_upstream_at,
           s.fired_at IS NULL AS waiting,
           extract(epoch FROM COALESCE(s.fired_at, konduit_clock_timestamp()) - s.first_upstream_at)::float8
               AS wait,
           row_number() OVER (PARTITION BY s.workflow_name, s.step
                              ORDER BY s.created_at DESC, s.execution_id DESC) AS newest
    FROM ({{step_of_recent_execution}}) s
    WHERE s.up_total >= 2
      AND s.first_upstream_at IS NOT NULL
      AND (s.fired_at IS NOT NULL
           OR (s.execution_status = 'running' AND s.status = 'waiting'
               AND konduit_clock_timestamp() - s.first_upstream_at
                   > make_interval(secs => %(threshold_seconds)s)))
)
SELECT w.workflow_name, w.workflow_version, w.step, w.execution_id, w.created_at, w.straggler,
       w.waiting, w.wait,
       COALESCE(
           (SELECT jsonb_object_agg(u.step,
                                    extract(epoch FROM u.ended_at - w.first_upstream_at)::float8)
            FROM konduit_steps u
            WHERE w.history_finished_at IS NULL AND u.execution_id = w.execution_id),
           (SELECT jsonb_object_agg(u.step,
                                    extract(epoch FROM u.ended_at - w.first_upstream_at)::float8)
            FROM konduit_history_steps u
            WHERE w.history_finished_at IS NOT NULL AND u.execution_id = w.execution_id
              AND u.history_finished_at = w.history_finished_at)) AS ends
FROM waits w
WHERE w.newest <= %(per_join)s
ORDER BY w.workflow_name, w.step, w.created_at, w.execution_id;
