-- Konduit schema, version 44: the history is searched as the hot tables are.
--
-- A search (konduit list, the API's and the pages' lists, app.search) now reads the history
-- beside the hot table (migration 0041): an execution moved there stays found by what found it
-- before. Its partitions get the indexes the hot table's search uses (migration 0024): the
-- newest-first order (created_at, id), a workflow's newest, an idempotency key alone, tags and
-- inputs by containment (GIN). Partitioned: each day's partition gets its own, the ones to
-- come when they are made (by the move, off the workers' path).
--
-- Online: creating an index on a partitioned table locks its partitions for the build, which
-- reads only the history; a move waiting on it gives up after its lock_timeout and moves at
-- its next pass.

CREATE INDEX konduit_history_executions_created_at ON konduit_history_executions
    (created_at DESC, id DESC);
CREATE INDEX konduit_history_executions_workflow ON konduit_history_executions
    (workflow_name, created_at DESC);
CREATE INDEX konduit_history_executions_key ON konduit_history_executions (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX konduit_history_executions_tags ON konduit_history_executions
    USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL;
CREATE INDEX konduit_history_executions_input ON konduit_history_executions
    USING gin (input jsonb_path_ops);
