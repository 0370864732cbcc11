-- Konduit schema, version 46: a child execution its parent still waits for stays in the hot tables.
--
-- A parent's child-workflow step waits (status 'waiting', wait_kind 'child') until its child
-- ends; the child's end wakes it at once, and the workers' waits pass (task_list_waits_due)
-- wakes it should that be missed: a worker that died right after the child's end, or a child
-- served by workers that do not run the parent's workflow, whose own workers are down. That
-- pass finds the child in the hot tables. Were the child moved into the history meanwhile
-- (history_after=, migration 0041), the parent would wait for ever. The move now leaves an
-- awaited child where the pass finds it (konduit_execution_awaited: one probe of
-- konduit_tasks_waiting_child), and takes it at the pass after its parent woke.
--
-- Online: a new function, and the move's function replaced.

CREATE FUNCTION konduit_execution_awaited(p_id uuid) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM konduit_tasks w
                   WHERE w.wait_child = p_id AND w.wait_kind = 'child' AND w.status = 'waiting')
$$;

CREATE OR REPLACE FUNCTION konduit_history_move(p_ids uuid[])
RETURNS TABLE (id uuid, finished_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET lock_timeout TO '5s'
AS $$
DECLARE
    moved uuid[];
    day date;
    t text;
    cols text;
    xcols text;
    source text;
BEGIN
    SELECT array_agg(e.id ORDER BY e.id) INTO moved
    FROM konduit_executions e
    WHERE e.id = ANY(p_ids)
      AND e.finished_at IS NOT NULL
      AND e.status IN ('succeeded', 'failed', 'timed_out', 'cancelled')
      AND NOT konduit_execution_awaited(e.id)
      AND (e.idempotency_key IS NULL
           OR pg_try_advisory_xact_lock(konduit_history_key_lock(e.workflow_name,
                                                                 e.idempotency_key)));
    IF moved IS NULL THEN
        RETURN;
    END IF;
    FOR day IN SELECT DISTINCT (e.finished_at AT TIME ZONE 'UTC')::date
               FROM konduit_executions e WHERE e.id = ANY(moved) LOOP
        PERFORM konduit_history_partition(day);
    END LOOP;
    FOREACH t IN ARRAY konduit_history_tables() LOOP
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
               string_agg('x.' || quote_ident(a.attname), ', ' ORDER BY a.attnum)
        INTO cols, xcols
        FROM pg_attribute a
        WHERE a.attrelid = ('konduit_' || t)::regclass AND a.attnum > 0 AND NOT a.attisdropped;
        source := CASE t
            WHEN 'executions' THEN
                'konduit_executions x JOIN konduit_executions e ON e.id = x.id'
            WHEN 'attempts' THEN
                'konduit_attempts x JOIN konduit_tasks k ON k.id = x.task_id '
                'JOIN konduit_executions e ON e.id = k.execution_id'
            WHEN 'attempt_logs' THEN
                'konduit_attempt_logs x JOIN konduit_attempts a ON a.lease_token = x.lease_token '
                'JOIN konduit_tasks k ON k.id = a.task_id '
                'JOIN konduit_executions e ON e.id = k.execution_id'
            ELSE
                format('%I x JOIN konduit_executions e ON e.id = x.execution_id', 'konduit_' || t)
        END;
        EXECUTE format('INSERT INTO %I (%s, history_finished_at) SELECT %s, e.finished_at '
                       'FROM %s WHERE e.id = ANY($1)',
                       'konduit_history_' || t, cols, xcols, source)
        USING moved;
    END LOOP;
    -- The keys stay taken (konduit_history_keys: one lookup for a start, whatever the days).
    INSERT INTO konduit_history_keys (workflow_name, idempotency_key, execution_id, input_hash,
                                      history_finished_at)
    SELECT e.workflow_name, e.idempotency_key, e.id, e.input_hash, e.finished_at
    FROM konduit_executions e
    WHERE e.id = ANY(moved) AND e.idempotency_key IS NOT NULL;
    -- The rest of the rows go with the execution (its trigger and foreign keys).
    RETURN QUERY
        DELETE FROM konduit_executions e WHERE e.id = ANY(moved)
        RETURNING e.id, e.finished_at;
END
$$;
