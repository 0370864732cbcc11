-- name: step_span_quantiles_by_workflow
-- p50/p95/p99 of each step's span (fired -> ended) over recent finished executions of a workflow.
SELECT s.step,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM s.ended_at - s.fired_at)::float8) AS p50,
       percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM s.ended_at - s.fired_at)::float8) AS p95,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM s.ended_at - s.fired_at)::float8) AS p99,
       count(*) AS samples,
       count(*) FILTER (WHERE s.status = 'degraded') AS degraded
FROM konduit_executions e
JOIN konduit_steps s ON s.execution_id = e.id
WHERE e.workflow_name = %(workflow_name)s
  AND e.finished_at IS NOT NULL
  AND e.created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
  AND s.status IN ('succeeded', 'degraded')
  AND s.fired_at IS NOT NULL
  AND s.ended_at IS NOT NULL
GROUP BY s.step
ORDER BY s.step;

-- name: workflow_overhead_quantiles
-- The p99s of what follows a branch's deadline besides the steps after it, over the newest
-- succeeded executions of a workflow (the window reserve's overheads): deadline -> branch ended
-- for expired tasks, due -> first claim for first attempts, last step ended -> execution
-- finished. Bounded: at most max_executions executions (newest first on
-- konduit_executions_workflow) and one task per step of each (map_index 0), so a big map does
-- not make the read big.
WITH recent AS (
    SELECT id, finished_at
    FROM konduit_executions
    WHERE workflow_name = %(workflow_name)s
      AND status = 'succeeded'
      AND created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
    ORDER BY created_at DESC
    LIMIT %(max_executions)s
), tasks AS (
    SELECT t.status, t.deadline_at, t.finished_at, t.started_at, t.attempt,
           greatest(t.created_at, t.run_at) AS due_at
    FROM recent r
    JOIN konduit_tasks t ON t.execution_id = r.id AND t.map_index = 0
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
    SELECT extract(epoch FROM r.finished_at - max(s.ended_at))::float8 AS seconds
    FROM recent r
    JOIN konduit_steps s ON s.execution_id = r.id
    WHERE s.ended_at IS NOT NULL
    GROUP BY r.id, r.finished_at
)
SELECT (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) FROM expired) AS fallback,
       (SELECT count(*) FROM expired) AS fallback_samples,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) FROM dispatched) AS dispatch,
       (SELECT count(*) FROM dispatched) AS dispatch_samples,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY greatest(seconds, 0))
        FROM finishes) AS finish,
       (SELECT count(*) FROM finishes) AS finish_samples;
