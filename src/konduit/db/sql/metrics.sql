-- name: execution_count_by_status
-- Executions created within the history, per workflow and status (the exporter's konduit_executions).
SELECT workflow_name, status, count(*) AS executions
FROM konduit_executions
WHERE created_at > clock_timestamp() - make_interval(secs => %(history_seconds)s)
GROUP BY workflow_name, status
ORDER BY workflow_name, status;
