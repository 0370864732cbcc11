-- Konduit schema, version 40: the running tasks' index is keyed by worker, not by lease expiry.
--
-- A heartbeat moves the lease expiry of every task its worker runs (every 3 s by default), and
-- konduit_tasks_leased was keyed on that column: each beat was a non-heap-only update, a new row
-- version through every index of konduit_tasks (four entries in all), about 536 bytes of WAL per
-- running task and beat; a task that ran a minute wrote some 10 kB that way, three times the
-- whole cost of a short task. Keyed on the worker (which a heartbeat never changes) and still
-- partial on status = 'running', the index leaves the expiry unindexed: a beat now updates the
-- row in place (heap-only) when its page has room (the table's fillfactor keeps some).
-- The rescue list reads the running tasks through it and keeps the lapsed ones, a read of the
-- fleet's running tasks (its slots), not of the history; workers of the previous release read it
-- the same way (their rescue list names the same predicate).
--
-- The new index is built here while writes to konduit_tasks wait (a scan of the table: seconds
-- for millions of rows); a big history can build it beforehand without blocking, by hand, with
-- CREATE INDEX CONCURRENTLY konduit_tasks_running ON konduit_tasks (worker_id)
-- WHERE status = 'running', which this migration then takes as it is.
CREATE INDEX IF NOT EXISTS konduit_tasks_running ON konduit_tasks (worker_id)
    WHERE status = 'running';
DROP INDEX konduit_tasks_leased;
