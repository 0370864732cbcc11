-- name: execution_list_auto_repair_due
-- Succeeded executions whose current output went out degraded and whose automatic repair is due
-- (repair_delay to repair_within after they finished) and not yet taken, soonest due first; one
-- (name, version, within, delay) per workflow version with a repair contract this worker serves.
-- Read through the partial index of armed repairs (auto_repair_due_at, set when they finished),
-- only as far back as the longest window: older ones ran out. (konduit_statement_timestamp() bounds
-- the index range; the take re-checks the window against konduit_clock_timestamp().)
SELECT e.id, e.workflow_name, e.workflow_version
FROM konduit_executions e
JOIN unnest(%(names)s::text[], %(versions)s::int[], %(within_seconds)s::float8[],
            %(delay_seconds)s::float8[]) AS w(name, version, within_seconds, delay_seconds)
  ON w.name = e.workflow_name AND w.version = e.workflow_version
WHERE e.auto_repair_at IS NULL AND e.auto_repair_due_at IS NOT NULL
  AND e.auto_repair_due_at <= konduit_statement_timestamp()
  AND e.auto_repair_due_at > konduit_statement_timestamp() - make_interval(secs => %(max_within_seconds)s)
  AND e.status = 'succeeded'
  AND e.finished_at > konduit_clock_timestamp() - make_interval(secs => w.within_seconds)
  AND e.finished_at <= konduit_clock_timestamp() - make_interval(secs => w.delay_seconds)
  AND EXISTS (SELECT 1 FROM konduit_execution_outputs o
              WHERE o.execution_id = e.id AND o.version = e.output_version
                AND o.degraded <> '{}')
ORDER BY e.auto_repair_due_at
LIMIT %(limit)s;

-- name: execution_claim_auto_repair_if_due
-- Take the one automatic repair of an execution: only while it is still succeeded with a
-- degraded current output, inside its repair window, and not taken before. Concurrent takers
-- queue on the row and re-check after the first commits, so exactly one gets a row back.
UPDATE konduit_executions e
SET auto_repair_at = konduit_clock_timestamp()
WHERE e.id = %(id)s
  AND e.status = 'succeeded'
  AND e.auto_repair_at IS NULL
  AND e.finished_at > konduit_clock_timestamp() - make_interval(secs => %(within_seconds)s)
  AND e.finished_at <= konduit_clock_timestamp() - make_interval(secs => %(delay_seconds)s)
  AND EXISTS (SELECT 1 FROM konduit_execution_outputs o
              WHERE o.execution_id = e.id AND o.version = e.output_version
                AND o.degraded <> '{}')
RETURNING e.id, e.auto_repair_at;

-- name: execution_mark_auto_repair_impossible_if_untaken
-- Record once why the automatic repair of an execution could not start (its join policy cannot
-- fire with the outcomes that stand, say), so that no worker tries it again.
-- sealed: error
UPDATE konduit_executions
SET auto_repair_at = konduit_clock_timestamp(), auto_repair_error = %(error)s
WHERE id = %(id)s AND status = 'succeeded' AND auto_repair_at IS NULL
RETURNING id;

-- name: execution_get_auto_repair
-- One execution's automatic repair: its state, its workflow's contract (from the stored spec)
-- and the steps its current output went out degraded with.
SELECT e.status, e.finished_at, e.auto_repair_at, e.auto_repair_error, w.spec,
       coalesce((SELECT o.degraded FROM konduit_execution_outputs_of(%(id)s::uuid) o
                 WHERE o.execution_id = e.id AND o.version = e.output_version),
                '{}'::text[]) AS degraded
FROM konduit_executions_of(%(id)s::uuid) e
JOIN konduit_workflows w ON w.name = e.workflow_name AND w.version = e.workflow_version
WHERE e.id = %(id)s;
