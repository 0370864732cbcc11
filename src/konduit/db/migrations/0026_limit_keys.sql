-- Konduit schema, version 26: limits per key (step(concurrency=konduit.Limit(2, key=...)),
-- rate=konduit.Rate("10/s", key=...)) and Workflow(max_running=N, key=...).
--
-- Per-key flow limits. A step whose limits are per key is `keyed` in its konduit_flow_limits
-- row (its concurrency and rate then apply to each key). Its tasks carry their key in
-- `limit_key`, computed from the execution's input when the execution starts (one key per
-- keyed step, kept in konduit_executions.limit_keys) and copied onto every task of the step
-- when the task is made, by the trigger below, whatever statement makes it.
ALTER TABLE konduit_flow_limits ADD COLUMN keyed boolean NOT NULL DEFAULT false;
ALTER TABLE konduit_tasks ADD COLUMN limit_key text;
ALTER TABLE konduit_executions ADD COLUMN limit_keys jsonb;

-- The ready tasks of each key in claim order: the claim finds the keys with ready tasks by
-- skipping from key to key on it (konduit_ready_limit_keys), never reading a key with none.
CREATE INDEX konduit_tasks_key_ready ON konduit_tasks
    (workflow, step, limit_key, priority, fair_turn, execution_id, id)
    WHERE limit_key IS NOT NULL AND status = 'ready';
-- The running tasks of each key, counted by the claim under the key's row lock.
CREATE INDEX konduit_tasks_key_running ON konduit_tasks (workflow, step, limit_key)
    WHERE limit_key IS NOT NULL AND status = 'running';

-- The key of a limited task: its execution's key for the step; '' (one key shared by all such
-- tasks) when the step is limited per key but the execution has no key for it (an execution
-- migrated from a version where the step was not), so that no task of a keyed step is left
-- without a key, out of every claim's reach.
CREATE FUNCTION konduit_limit_key(p_keys jsonb, p_workflow text, p_step text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(p_keys ->> p_step,
                    (SELECT '' FROM konduit_flow_limits f
                     WHERE f.workflow = p_workflow AND f.step = p_step AND f.keyed))
$$;

CREATE FUNCTION konduit_task_limit_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.limit_key := konduit_limit_key((SELECT e.limit_keys FROM konduit_executions e
                                        WHERE e.id = NEW.execution_id), NEW.workflow, NEW.step);
    RETURN NEW;
END $$;

-- Only limited tasks pay for it (one lookup by primary key); an unlimited task never fires it.
CREATE TRIGGER konduit_tasks_limit_key BEFORE INSERT ON konduit_tasks
    FOR EACH ROW WHEN (NEW.limited) EXECUTE FUNCTION konduit_task_limit_key();

-- One row per (workflow version, step, key) with ready or recently started tasks: created on
-- demand by the claim (INSERT ... ON CONFLICT DO NOTHING), locked by it FOR UPDATE SKIP LOCKED
-- while it counts the key's running tasks and rate window, and deleted by the retention pass
-- once no live task refers to it and its window is empty (its throttled time then moves to the
-- step's row). A million keys are a million rows, never read by a claim that does not serve them.
CREATE TABLE konduit_flow_keys (
    workflow          text        NOT NULL,
    step              text        NOT NULL,
    key               text        NOT NULL,
    starts            timestamptz[] NOT NULL DEFAULT '{}',
    throttled_since   timestamptz,
    throttled_seconds double precision NOT NULL DEFAULT 0 CHECK (throttled_seconds >= 0),
    throttled_claims  bigint      NOT NULL DEFAULT 0 CHECK (throttled_claims >= 0),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow, step, key)
);
CREATE INDEX konduit_flow_keys_idle ON konduit_flow_keys (updated_at);
-- The keys throttled now, for stats (flow_limit_list_top_keys).
CREATE INDEX konduit_flow_keys_throttled ON konduit_flow_keys (workflow, step)
    WHERE throttled_since IS NOT NULL;

-- Up to `n` keys of a keyed step with ready tasks in the given queues, in key order after
-- `after` (wrapping around to the first key): a skip scan on konduit_tasks_key_ready, one index
-- probe per key found, so the claim's cost follows the keys it serves, not the keys that exist.
-- The caller passes the last key it served as `after`, so keys take turns.
CREATE FUNCTION konduit_ready_limit_keys(p_workflow text, p_step text, p_queues text[],
                                         p_after text, p_n int)
RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k text := p_after;
    first text := NULL;
    taken int := 0;
    wrapped boolean := p_after IS NULL;
BEGIN
    LOOP
        EXIT WHEN taken >= p_n;
        SELECT t.limit_key INTO k
        FROM konduit_tasks t
        WHERE t.workflow = p_workflow AND t.step = p_step AND t.limit_key IS NOT NULL
          AND t.status = 'ready' AND (k IS NULL OR t.limit_key > k)
          AND t.queue = ANY(p_queues)
        ORDER BY t.limit_key
        LIMIT 1;
        IF NOT FOUND THEN
            EXIT WHEN wrapped;
            wrapped := true;
            k := NULL;
            CONTINUE;
        END IF;
        EXIT WHEN wrapped AND p_after IS NOT NULL AND k > p_after;
        EXIT WHEN k = first;
        first := COALESCE(first, k);
        taken := taken + 1;
        RETURN NEXT k;
    END LOOP;
END $$;

-- Workflow(max_running=N, key=...): an execution's key (its workflow's `key` of its input, ''
-- without one). A start over the limit leaves the execution `pending` (its root tasks are set
-- aside from the claim, as `limited` tasks of no limited step); a finish of the key's running
-- execution, or the maintenance pass, starts the oldest pending ones under the key's row lock.
ALTER TABLE konduit_executions ADD COLUMN run_key text;
CREATE INDEX konduit_executions_run_key ON konduit_executions (workflow_name, run_key, status,
                                                               created_at, id)
    WHERE run_key IS NOT NULL AND status IN ('pending', 'running');

-- One row per (workflow, key) with running or pending executions: the lock every start and
-- every slot fill of the key takes before counting its running executions.
CREATE TABLE konduit_run_slots (
    workflow_name text        NOT NULL,
    key           text        NOT NULL,
    max_running   integer     NOT NULL CHECK (max_running >= 1),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, key)
);
