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
  AND e.created_at > clock_timestamp() - make_interval(secs => %(history_seconds)s)
  AND s.status IN ('succeeded', 'degraded')
  AND s.fired_at IS NOT NULL
  AND s.ended_at IS NOT NULL
GROUP BY s.step
ORDER BY s.step;
