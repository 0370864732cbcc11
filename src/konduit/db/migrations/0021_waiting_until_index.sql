-- Konduit schema, version 21: the waits due are found without reading the ready backlog.
--
-- task_list_waits_due (every worker's maintenance pass, every interval) looks for waiting tasks
-- whose wait_until has passed: timers due, and events accepted. No index covered waiting tasks
-- of both kinds by wait_until, so PostgreSQL read them through konduit_tasks_live, which holds
-- every ready task too: with a 40,000-item map queued, 2,400 buffers and 61 ms per pass, on
-- every worker, growing with every map (tests/test_backlog_maintenance.py).
CREATE INDEX konduit_tasks_waiting_until ON konduit_tasks (wait_until)
    WHERE status = 'waiting';
