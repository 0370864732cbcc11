-- name: maintenance_get_next_due
-- Seconds from now to the next moment a maintenance pass has work (NULL: none known): a task's deadline, a running task's grace ending, a timer, an automatic repair. Each a first-row scan of its partial index.
SELECT extract(epoch FROM least(
           -- The earliest deadline still ahead (konduit_tasks_deadline).
           (SELECT min(deadline_at) FROM konduit_tasks
            WHERE status IN ('ready', 'running', 'waiting') AND deadline_at IS NOT NULL
              AND deadline_at > clock_timestamp()),
           -- A running task past its deadline by less than the grace (its worker lives, so the
           -- sweep waits for it): the backstop comes when the grace ends.
           (SELECT min(deadline_at) + make_interval(secs => %(grace_seconds)s) FROM konduit_tasks
            WHERE status IN ('ready', 'running', 'waiting') AND deadline_at IS NOT NULL
              AND deadline_at <= clock_timestamp()
              AND deadline_at > clock_timestamp() - make_interval(secs => %(grace_seconds)s)
              AND status = 'running')
       ) - clock_timestamp())::float8 AS deadline,
       -- The earliest timer still ahead (konduit_tasks_waiting_timer).
       extract(epoch FROM (SELECT min(wait_until) FROM konduit_tasks
                           WHERE status = 'waiting' AND wait_kind = 'timer'
                             AND wait_until > clock_timestamp()) - clock_timestamp())::float8
           AS timer,
       -- The earliest automatic repair still ahead (konduit_executions_auto_repair_due).
       extract(epoch FROM (SELECT min(auto_repair_due_at) FROM konduit_executions
                           WHERE auto_repair_at IS NULL AND auto_repair_due_at IS NOT NULL
                             AND auto_repair_due_at > clock_timestamp()) - clock_timestamp())::float8
           AS repair;

-- name: maintenance_notify_deadline
-- Wake the other workers' maintenance loops to re-read the next deadline: sent only when a claim set one earlier than this worker's own next wake-up (docs/deadlines.md), never per task.
SELECT pg_notify('konduit_deadline', '');
