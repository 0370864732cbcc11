-- Konduit schema, version 42: the history reads as the hot tables do (migration 0041).
--
-- The reads of one execution go through the konduit_<table>_all views; what they look an
-- execution up by in the hot tables, the history now has an index on too (partitioned: each
-- day's partition gets its own, the ones to come when they are made):
--   an id's tail (the piece every face shows, resolved by konduit.engine.ids), as
--   konduit_executions_id_tail (migration 0024);
--   a child's parent (the child-workflow task that waits for it), as konduit_tasks_waiting_child;
--   an execution's forks, as konduit_executions_forked_from.
-- And a write refused because its execution is in the history (ExecutionInHistory) says when
-- it moved: history_moved_at, set by the move (its default; NULL for those moved before).
--
-- Online: the history tables are new (migration 0041) and read by nothing that holds them
-- long; creating an index on a partitioned table locks its partitions for the build, which
-- reads only the history.

CREATE INDEX konduit_history_executions_id_tail ON konduit_history_executions
    (reverse(id::text) text_pattern_ops);
CREATE INDEX konduit_history_tasks_waiting_child ON konduit_history_tasks (wait_child)
    WHERE wait_kind = 'child';
CREATE INDEX konduit_history_executions_forked_from ON konduit_history_executions
    (forked_from, created_at) WHERE forked_from IS NOT NULL;

ALTER TABLE konduit_history_executions ADD COLUMN history_moved_at timestamptz;
ALTER TABLE konduit_history_executions ALTER COLUMN history_moved_at SET DEFAULT konduit_now();
