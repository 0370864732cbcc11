-- Konduit schema, version 19: every execution gets its share of a queue.
--
-- Before, the claim took ready tasks strictly by (priority, execution id): a map of a million
-- items, or a batch of 100,000 executions, held every execution started after it until it was
-- done. Now each ready task carries a fair turn, given when it becomes ready, and the claim
-- takes tasks by (priority, fair turn, execution id): start-time fair queueing, with tasks in
-- the place of packets and executions (a batch start as one) in the place of flows.
--
-- * A queue's clock (konduit_queue_clocks) is the latest fair turn claimed in it: the claim
--   moves it forward (skipping the row while another claim holds it; the next claim catches up).
-- * Tasks made ready together take turns from the clock on: the n-th of them gets turn
--   clock + n / 8 (konduit_task_turn), so an execution gets 8 tasks a turn however many it has
--   ready, and a batch start spreads its executions over turns the same way. An execution
--   started while a map of a million items runs gets the turn being claimed: it waits for a
--   turn's worth of tasks, not for the million.
-- * Ties go to the older execution (execution ids are UUIDv7): an execution's next step, made
--   ready at the clock, goes before the newer executions' tasks of that turn, so executions
--   still finish rather than all start. A retry keeps its turn (it comes back first).
--
-- The ready index leads with the queue, the workflow version and `limited`: the claim reads it
-- once per (queue, served workflow), unlimited tasks only, so ready work of workflows the worker
-- does not serve, and a throttled step's backlog, are never read (they were a filter over every
-- row ahead in the old order). It still holds every ready task (the queue depth reads it).
--
-- Clocks are created when a worker registers for its queues (worker_register), so the claim
-- only ever updates one, skipping it while another claim holds it.
ALTER TABLE konduit_tasks ADD COLUMN fair_turn bigint NOT NULL DEFAULT 0;

CREATE TABLE konduit_queue_clocks (
    queue      text   PRIMARY KEY,
    fair_turn  bigint NOT NULL  -- the latest fair turn a claim took in this queue
);

-- The turn of the n-th (from 0) of the tasks made ready together at clock `base`. IMMUTABLE SQL:
-- inlined into the statements that call it. 8 is the share an execution gets each turn.
CREATE FUNCTION konduit_task_turn(base bigint, nth bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT base + nth / 8 $$;

DROP INDEX konduit_tasks_ready;
CREATE INDEX konduit_tasks_ready ON konduit_tasks
    (queue, workflow, limited, priority, fair_turn, execution_id, id)
    WHERE status = 'ready';

DROP INDEX konduit_tasks_limited;
CREATE INDEX konduit_tasks_limited ON konduit_tasks
    (workflow, step, status, priority, fair_turn, execution_id, id)
    WHERE limited AND status IN ('ready', 'running');
