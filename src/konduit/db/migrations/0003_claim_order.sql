-- Konduit schema, version 3: claim order.
-- The claim takes, within a priority, the tasks of the execution that started first (execution
-- ids are UUIDv7, so they sort by start time), so a backlog drains execution by execution: an old
-- execution's join beats a new execution's roots. It reads one queue at a time, in index order,
-- and stops after its limit; run_at stays a filter (a retry waiting out its backoff is skipped,
-- not sorted), so a ready index keyed on it would no longer give the claim its order.
DROP INDEX konduit_tasks_ready;
CREATE INDEX konduit_tasks_ready ON konduit_tasks (queue, priority, execution_id, id)
    WHERE status = 'ready';
