-- Konduit schema, version 45: a step's durations are read from the history too.
--
-- An adaptive deadline (Deadline.adaptive: a quantile of the step's recent successful
-- durations) and a window's reserve (the p99 of the steps downstream, the workflow's overheads)
-- read the step's recent successes. With history_after= a nightly pipeline's successes move into
-- the history (migration 0041) a day after they finish, so those reads now take both sides. The
-- history gets the hot table's index of a step's successes, newest first
-- (konduit_tasks_succeeded_by_step), so each day's partition is one bounded index range scan.
--
-- Online: creating an index on a partitioned table locks its partitions for the build, which
-- reads only the history; a move waiting on it gives up after its lock_timeout and moves at
-- its next pass.

CREATE INDEX konduit_history_tasks_succeeded_by_step ON konduit_history_tasks
    (split_part(workflow, '@', 1), step, finished_at DESC) WHERE status = 'succeeded';
