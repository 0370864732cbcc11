-- Konduit schema, version 16: window-aware budgets and a bounded read of adaptive deadlines.
--
-- A task whose budget its execution's window cut (konduit.core.budgets: the smaller of its own
-- deadline and the time left in the window minus the p95 of the critical path downstream of it)
-- records what its own budget was and how much time it kept free for the steps after it, so
-- `konduit plan` and the execution page can say "budget cut by the window". Both are NULL when
-- the window did not cut the budget; a cut always leaves a shorter, real budget.
ALTER TABLE konduit_tasks
    ADD COLUMN deadline_uncut_seconds double precision,
    ADD COLUMN deadline_reserve_seconds double precision CHECK (deadline_reserve_seconds >= 0),
    ADD CONSTRAINT konduit_tasks_deadline_cut_check CHECK (
        (deadline_uncut_seconds IS NULL) = (deadline_reserve_seconds IS NULL)
        AND (deadline_uncut_seconds IS NULL
             OR (deadline_seconds IS NOT NULL AND deadline_seconds < deadline_uncut_seconds)));

-- Adaptive deadlines read a quantile of a step's recent successful runs (step_duration_quantile):
-- its most recent successful tasks, newest first, found by (workflow name, step) without
-- scanning every success of every step in the window.
CREATE INDEX konduit_tasks_succeeded_by_step
    ON konduit_tasks (split_part(workflow, '@', 1), step, finished_at DESC)
    WHERE status = 'succeeded';
