-- Konduit schema, version 18: a fallback runs at most once per task.
--
-- Set (task_start_fallback_if_unstarted) and committed before a step's fallback is called, by
-- whichever path calls it: the task's own worker, the deadline sweep, a rescue, a child's wake.
-- A fallback that kills or hangs its worker leaves it set: the next sweep or rescue reads it,
-- never calls the fallback again, and ends the task timed_out once the fallback's time limit is
-- over (instead of every new worker running the same fallback and dying in turn). Never
-- cleared: a repair makes a new task row of its own.
-- A column nothing indexes: setting it keeps the update HOT.
ALTER TABLE konduit_tasks ADD COLUMN fallback_started_at timestamptz;
