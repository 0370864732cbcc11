-- name: execution_count_by_status
-- Executions created within the history, per workflow and status (the exporter's konduit_executions).
SELECT workflow_name, status, count(*) AS executions
FROM konduit_executions
WHERE created_at > konduit_clock_timestamp() - make_interval(secs => %(history_seconds)s)
GROUP BY workflow_name, status
ORDER BY workflow_name, status;

-- name: task_count_live_by_queue
-- What to scale workers on, per queue and workflow: tasks ready to run now (due), ready but
-- waiting out a backoff or a start time (delayed), running, and how long the oldest due one has
-- waited to be claimed (0 when none is due). Reads the ready and running tasks' index entries:
-- a backlog of a million ready tasks is a million entries read per scrape.
-- plan: custom, as many rows as tasks are ready or running.
SELECT queue, split_part(workflow, '@', 1) AS workflow,
       count(*) FILTER (WHERE status = 'ready' AND run_at <= konduit_clock_timestamp()) AS ready,
       count(*) FILTER (WHERE status = 'ready' AND run_at > konduit_clock_timestamp()) AS delayed,
       count(*) FILTER (WHERE status = 'running') AS running,
       coalesce(extract(epoch FROM konduit_clock_timestamp() - min(run_at) FILTER (
           WHERE status = 'ready' AND run_at <= konduit_clock_timestamp()))::float8, 0) AS oldest_ready_age
FROM konduit_tasks
WHERE status IN ('ready', 'running')
GROUP BY queue, split_part(workflow, '@', 1)
ORDER BY queue, workflow;
