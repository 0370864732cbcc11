-- Konduit schema, version 27: fair shares between keys (Workflow(fair_by=...)).
--
-- Migration 0019 gives each execution (a batch start as one) its share of a queue: its tasks
-- take turns from the queue's clock. But 10,000 executions of one customer started one by one
-- each take the clock's turn, so another customer's execution started after them waits for all
-- of them. With fair_by, the flow that takes turns is the key (a customer), not the execution:
--
-- * konduit_fair_keys holds, per (queue, key), the key's next slot: where its next execution's
--   root tasks go, in eighths of a turn (8 tasks a turn, as konduit_task_turn). A start of a key
--   takes its slots from greatest(queue clock x 8, the key's next slot) and moves the slot past
--   them; a task's turn is its slot / 8. A key with a backlog spreads it over the turns ahead;
--   a key with none starts at the clock's turn and is claimed within a round.
-- * Nothing changes in the claim: it reads konduit_tasks_ready in (priority, fair turn,
--   execution) order as before, so its cost does not depend on the number of keys. A key's
--   row is read and written only when one of its executions starts.
-- * A row whose next slot is behind its queue's clock means the same as no row: retention
--   deletes those (konduit prune, App(retention=)), so keys come and go without bound.
-- * The execution keeps its key (konduit_executions.fair_key) to be seen and searched by.
ALTER TABLE konduit_executions ADD COLUMN fair_key text;

CREATE INDEX konduit_executions_fair_key ON konduit_executions (fair_key, id)
    WHERE fair_key IS NOT NULL;

CREATE TABLE konduit_fair_keys (
    queue      text   NOT NULL,
    fair_key   text   NOT NULL,
    next_slot  bigint NOT NULL,  -- eighths of a turn: the first slot the key's next start takes
    PRIMARY KEY (queue, fair_key)
);

-- The turn of a task in slot `slot` (eighths of a turn). IMMUTABLE SQL: inlined. The Python
-- twin, tested for the arithmetic, is konduit.core.fair.
CREATE FUNCTION konduit_slot_turn(slot bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT slot / 8 $$;

-- Retention finds the stale rows of a queue (next slot behind its clock) on this index instead
-- of reading every key.
CREATE INDEX konduit_fair_keys_stale ON konduit_fair_keys (queue, next_slot);
