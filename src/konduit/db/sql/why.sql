-- name: task_list_open_or_waited_by_execution
-- Why an execution is where it is: its unfinished tasks (ready, in backoff, running, waiting)
-- and every task that made a durable wait, with the worker holding a running one and how long
-- ago it was heard from, for the execution page's step details and wait bars. Bounded: a map
-- step of many items is summarised elsewhere.
-- plan: custom, as many rows as the execution has open tasks (a map: its open items).
SELECT t.id, t.step, t.map_index, t.generation, t.status, t.attempt, t.max_attempts,
       t.worker_id, t.run_at, t.deadline_at, t.started_at, t.finished_at, t.wait_kind,
       t.wait_event, t.wait_key, t.wait_until, t.wait_child,
       (SELECT max(a.finished_at) FROM konduit_attempts_of(%(execution_id)s::uuid) a
        WHERE a.task_id = t.id AND a.outcome = 'waiting') AS waiting_since,
       w.hostname AS worker_hostname, w.pid AS worker_pid,
       extract(epoch FROM konduit_clock_timestamp() - w.last_heartbeat_at)::float8 AS heartbeat_age,
       t.status = 'ready' AND t.attempt > 0 AND t.run_at > konduit_clock_timestamp() AS in_backoff
FROM konduit_tasks_of(%(execution_id)s::uuid) t
LEFT JOIN konduit_workers w ON w.id = t.worker_id AND t.status = 'running'
WHERE t.execution_id = %(execution_id)s
  AND (t.status IN ('ready', 'running', 'waiting') OR t.wait_kind IS NOT NULL)
ORDER BY t.step, t.map_index, t.generation
LIMIT %(limit)s;

-- name: task_count_open_by_queue_and_workflow
-- The queue page: per queue and workflow version, tasks ready (and how many are due, not
-- waiting out a backoff), running and waiting durably, and how long the oldest due one has
-- waited to be claimed.
-- plan: custom, reads every unfinished task (a backlog).
SELECT queue, workflow,
       count(*) FILTER (WHERE status = 'ready') AS ready,
       count(*) FILTER (WHERE status = 'ready' AND run_at <= konduit_clock_timestamp()) AS due,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'waiting') AS waiting,
       extract(epoch FROM konduit_clock_timestamp() - min(run_at)
               FILTER (WHERE status = 'ready' AND run_at <= konduit_clock_timestamp()))::float8
           AS oldest_age
FROM konduit_tasks
WHERE status IN ('ready', 'running', 'waiting')
GROUP BY queue, workflow
ORDER BY queue, workflow;
