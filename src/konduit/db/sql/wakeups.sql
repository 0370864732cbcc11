-- name: task_get_next_due
-- Seconds from now to the next moment a maintenance pass has work, by kind (NULL: none known):
-- a task's deadline (or the end of a live worker's grace), a timer, an automatic repair. Each is
-- one first-row scan of its partial index: konduit_statement_timestamp(), not konduit_clock_timestamp(), so that
-- the bound is an index condition (a volatile one would be a filter over every indexed row).
SELECT extract(epoch FROM least(
           -- The earliest deadline still ahead (konduit_tasks_deadline).
           (SELECT min(deadline_at) FROM konduit_tasks
            WHERE status IN ('ready', 'running', 'waiting') AND deadline_at IS NOT NULL
              AND deadline_at > konduit_statement_timestamp()),
           -- A running task past its deadline by less than the grace (its worker lives, so the
           -- sweep leaves it to that worker): the backstop comes when the grace ends.
           (SELECT min(deadline_at) + make_interval(secs => %(grace_seconds)s) FROM konduit_tasks
            WHERE status IN ('ready', 'running', 'waiting') AND deadline_at IS NOT NULL
              AND deadline_at <= konduit_statement_timestamp()
              AND deadline_at > konduit_statement_timestamp() - make_interval(secs => %(grace_seconds)s)
              AND status = 'running')
       ) - konduit_statement_timestamp())::float8 AS deadline,
       -- The earliest timer still ahead (konduit_tasks_waiting_timer).
       extract(epoch FROM (SELECT min(wait_until) FROM konduit_tasks
                           WHERE status = 'waiting' AND wait_kind = 'timer'
                             AND wait_until > konduit_statement_timestamp())
                          - konduit_statement_timestamp())::float8 AS timer,
       -- The earliest automatic repair still ahead (konduit_executions_auto_repair_due).
       extract(epoch FROM (SELECT min(auto_repair_due_at) FROM konduit_executions
                           WHERE auto_repair_at IS NULL AND auto_repair_due_at IS NOT NULL
                             AND auto_repair_due_at > konduit_statement_timestamp())
                          - konduit_statement_timestamp())::float8 AS repair;

-- name: task_notify_deadline_sooner
-- Wake the other workers' maintenance loops to re-read the next deadline: sent only when a claim
-- set one earlier than this worker's own next wake-up (konduit.worker.wakeups), never per task.
SELECT pg_notify('konduit_deadline', '');
