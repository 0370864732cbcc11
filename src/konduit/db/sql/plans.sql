-- name: step_span_quantiles_by_workflow
-- p50/p95/p99 of each step's span (fired -> ended) over recent finished executions of a
-- workflow, of the hot tables and of the history alike (migration 0041: with history_after=, a
-- nightly pipeline's runs are mostly there). A day of the history that ended before the
-- window's start cannot hold an execution created in it, so its partitions are pruned; a step
-- is looked up in its execution's own day.
WITH spans AS (
    SELECT s.step, s.status, s.fired_at, s.ended_at
    FROM konduit_executions e
    JOIN konduit_steps s ON s.execution_id = e.id
    WHERE e.workflow_name = %(workflow_name)s
      AND e.finished_at IS NOT NULL
      AND e.created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
      AND s.status IN ('succeeded', 'degraded')
      AND s.fired_at IS NOT NULL
      AND s.ended_at IS NOT NULL
    UNION ALL
    SELECT s.step, s.status, s.fired_at, s.ended_at
    FROM konduit_history_executions e
    JOIN konduit_history_steps s
      ON s.execution_id = e.id AND s.history_finished_at = e.history_finished_at
    WHERE e.workflow_name = %(workflow_name)s
      AND e.created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
      AND e.history_finished_at > konduit_now() - make_interval(secs => %(history_seconds)s)
      AND s.status IN ('succeeded', 'degraded')
      AND s.fired_at IS NOT NULL
      AND s.ended_at IS NOT NULL
)
SELECT step,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM ended_at - fired_at)::float8) AS p50,
       percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM ended_at - fired_at)::float8) AS p95,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM ended_at - fired_at)::float8) AS p99,
       count(*) AS samples,
       count(*) FILTER (WHERE status = 'degraded') AS degraded
FROM spans
GROUP BY step
ORDER BY step;

-- name: workflow_overhead_quantiles
-- The p99s of what follows a branch's deadline besides the steps after it, over the newest
-- succeeded executions of a workflow (the window reserve's overheads): deadline -> branch ended
-- for expired tasks, due -> first claim for first attempts, last step ended -> execution
-- finished. Bounded: at most max_executions executions (newest first on
-- konduit_executions_workflow, and its copy in the history) and one task per step of each
-- (map_index 0), so a big map does not make the read big. The hot tables and the history alike
-- (as step_span_quantiles_by_workflow): a moved execution's tasks and steps are looked up in its
-- own day.
WITH recent AS (
    SELECT *
    FROM ((
        SELECT id, finished_at, NULL::timestamptz AS history_finished_at, created_at
        FROM konduit_executions
        WHERE workflow_name = %(workflow_name)s
          AND status = 'succeeded'
          AND created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
        ORDER BY created_at DESC
        LIMIT %(max_executions)s
    ) UNION ALL (
        SELECT id, finished_at, history_finished_at, created_at
        FROM konduit_history_executions
        WHERE workflow_name = %(workflow_name)s
          AND status = 'succeeded'
          AND created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
          AND history_finished_at > konduit_now() - make_interval(secs => %(history_seconds)s)
        ORDER BY created_at DESC
        LIMIT %(max_executions)s
    )) AS both_sides
    ORDER BY created_at DESC
    LIMIT %(max_executions)s
), tasks AS (
    SELECT t.status, t.deadline_at, t.finished_at, t.started_at, t.attempt,
           greatest(t.created_at, t.run_at) AS due_at
    FROM recent r
    JOIN konduit_tasks t ON t.execution_id = r.id AND t.map_index = 0
    WHERE r.history_finished_at IS NULL
    UNION ALL
    SELECT t.status, t.deadline_at, t.finished_at, t.started_at, t.attempt,
           greatest(t.created_at, t.run_at) AS due_at
    FROM recent r
    JOIN konduit_history_tasks t
      ON t.execution_id = r.id AND t.history_finished_at = r.history_finished_at
         AND t.map_index = 0
), ended AS (
    SELECT r.id, r.finished_at, s.ended_at
    FROM recent r
    JOIN konduit_steps s ON s.execution_id = r.id
    WHERE r.history_finished_at IS NULL
    UNION ALL
    SELECT r.id, r.finished_at, s.ended_at
    FROM recent r
    JOIN konduit_history_steps s
      ON s.execution_id = r.id AND s.history_finished_at = r.history_finished_at
), expired AS (
    SELECT extract(epoch FROM finished_at - deadline_at)::float8 AS seconds
    FROM tasks
    WHERE status IN ('degraded', 'timed_out')
      AND deadline_at IS NOT NULL
      AND finished_at >= deadline_at
), dispatched AS (
    SELECT extract(epoch FROM started_at - due_at)::float8 AS seconds
    FROM tasks
    WHERE started_at IS NOT NULL AND started_at >= due_at
), finishes AS (
    SELECT extract(epoch FROM finished_at - max(ended_at))::float8 AS seconds
    FROM ended
    WHERE ended_at IS NOT NULL
    GROUP BY id, finished_at
)
SELECT (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) FROM expired) AS fallback,
       (SELECT count(*) FROM expired) AS fallback_samples,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) FROM dispatched) AS dispatch,
       (SELECT count(*) FROM dispatched) AS dispatch_samples,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY greatest(seconds, 0))
        FROM finishes) AS finish,
       (SELECT count(*) FROM finishes) AS finish_samples;
