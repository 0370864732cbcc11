-- fragment: step_counters_set
-- The SET list that writes a step's status and join counters from the row `u` of an unnest
-- (a round's fan-in decisions, a repair's rebuilt counters): one list, so a counter added is
-- written by both.
status = u.status,
up_pending = u.up_pending,
up_ok = u.up_ok,
up_failed = u.up_failed,
up_required_failed = u.up_required_failed,
up_skipped = u.up_skipped,
tasks_total = u.tasks_total,
tasks_pending = u.tasks_pending,
tasks_ok = u.tasks_ok,
tasks_degraded = u.tasks_degraded,
tasks_failed = u.tasks_failed

-- name: step_get_all
-- Every step of one execution, for status pages and the final output.
SELECT step, status, up_total, up_pending, up_ok, up_failed, up_skipped, tasks_total,
       tasks_pending, tasks_ok, tasks_degraded, tasks_failed, first_upstream_at,
       last_upstream_at, straggler, fired_at, ended_at
FROM konduit_steps
WHERE execution_id = %(execution_id)s;

-- name: step_get_all_with_history
-- Every step of one execution, in the hot table or moved into the history (migration 0041),
-- for the reads that show it, by name.
SELECT step, status, up_total, up_pending, up_ok, up_failed, up_skipped, tasks_total,
       tasks_pending, tasks_ok, tasks_degraded, tasks_failed, first_upstream_at,
       last_upstream_at, straggler, fired_at, ended_at
FROM konduit_steps_of(%(execution_id)s::uuid)
WHERE execution_id = %(execution_id)s
ORDER BY step;  -- its two sides' physical orders differ: one order, whichever side answers

-- name: step_cancel_unfinished
-- End every step of a stopped execution that had not ended.
UPDATE konduit_steps
SET status = 'cancelled', ended_at = konduit_clock_timestamp()
WHERE execution_id = %(execution_id)s AND status IN ('waiting', 'active');

-- name: step_get_outcomes
-- Step-level outcome of some steps of one execution.
SELECT step, status
FROM konduit_steps
WHERE execution_id = %(execution_id)s AND step = ANY(%(steps)s::text[]);

-- name: step_reset_many
-- Repair: put the steps being re-run back to waiting (or active) with rebuilt join counters
-- (core.repair.plan_repair: no task of a re-run step has ended yet).
UPDATE konduit_steps s
SET {{step_counters_set}},
    first_upstream_at = NULL,
    last_upstream_at = NULL,
    straggler = NULL,
    fired_at = CASE WHEN u.status = 'active' THEN konduit_clock_timestamp() END,
    ended_at = NULL
FROM unnest(%(steps)s::text[], %(statuses)s::text[], %(up_pendings)s::int[], %(up_oks)s::int[],
            %(up_faileds)s::int[], %(up_required_faileds)s::int[], %(up_skippeds)s::int[],
            %(tasks_totals)s::int[], %(tasks_pendings)s::int[], %(tasks_oks)s::int[],
            %(tasks_degradeds)s::int[], %(tasks_faileds)s::int[])
     AS u(step, status, up_pending, up_ok, up_failed, up_required_failed, up_skipped,
          tasks_total, tasks_pending, tasks_ok, tasks_degraded, tasks_failed)
WHERE s.execution_id = %(execution_id)s AND s.step = u.step;
