-- Konduit schema, version 5: retention (prune) and the 24-hour repair contract (repair_within).

-- The one automatic repair an execution gets ("retry once within 24 hours to replace the
-- degraded version"). A worker takes it by setting auto_repair_at from NULL in the same statement
-- that checks the execution is still due (konduit.engine.auto_repair), so however many workers
-- race, one takes it and it is never taken twice. auto_repair_error says why a taken repair could
-- not start (its join policy cannot fire with the outcomes that stand, say).
ALTER TABLE konduit_executions
    ADD COLUMN auto_repair_at     timestamptz,
    ADD COLUMN auto_repair_error  text,
    ADD CONSTRAINT konduit_executions_auto_repair_error
        CHECK (auto_repair_error IS NULL OR auto_repair_at IS NOT NULL);

-- Prune walks finished executions oldest first, in batches, resuming after the last one deleted.
CREATE INDEX konduit_executions_finished ON konduit_executions (finished_at, id)
    WHERE finished_at IS NOT NULL;

-- Auto-repair candidates: only output versions that went out degraded are indexed, so the
-- maintenance loop's look for due repairs stays small however many clean executions finish.
CREATE INDEX konduit_execution_outputs_degraded ON konduit_execution_outputs (created_at)
    WHERE degraded <> '{}';
