-- Konduit schema, version 43: the idempotency keys of the history in one table.
--
-- A start with an idempotency key must not start again what a moved execution started
-- (migration 0041). Looked up in konduit_history_executions, the key costs one probe of every
-- day's partition, and a start without a reused key (the usual one) pays it: about 1 ms with 30
-- days kept, 6 ms with 365, growing with every day a deployment without retention keeps. The
-- keys now stay in konduit_history_keys, not partitioned, keyed by (workflow, key): one probe.
-- The move writes a row per keyed execution it moves; dropping a day deletes its keys (a narrow
-- table: what vacuum has to take back is small, and nothing of it is in the workers' tables).
--
-- Online: a new table, filled from the history of this release's earlier migrations (none in
-- a database that never set history_after), and the two functions replaced.

CREATE TABLE konduit_history_keys (
    workflow_name        text         NOT NULL,
    idempotency_key      text         NOT NULL,
    execution_id         uuid         NOT NULL,
    input_hash           text         NOT NULL,
    history_finished_at  timestamptz  NOT NULL,
    CONSTRAINT konduit_history_keys_pkey PRIMARY KEY (workflow_name, idempotency_key)
);
CREATE INDEX konduit_history_keys_finished ON konduit_history_keys (history_finished_at);

INSERT INTO konduit_history_keys (workflow_name, idempotency_key, execution_id, input_hash,
                                  history_finished_at)
SELECT workflow_name, idempotency_key, id, input_hash, history_finished_at
FROM konduit_history_executions
WHERE idempotency_key IS NOT NULL
ON CONFLICT DO NOTHING;

DROP INDEX konduit_history_executions_key;

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

CREATE OR REPLACE FUNCTION konduit_history_drop_day(p_day date) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET lock_timeout TO '5s'
AS $$
DECLARE
    t text;
    n bigint := 0;
    part text;
BEGIN
    part := format('konduit_history_executions_p%s', to_char(p_day, 'YYYYMMDD'));
    IF to_regclass(part) IS NOT NULL THEN
        EXECUTE format('SELECT count(*) FROM %I', part) INTO n;
    END IF;
    DELETE FROM konduit_history_keys
    WHERE history_finished_at >= (p_day::timestamp AT TIME ZONE 'UTC')
      AND history_finished_at < ((p_day + 1)::timestamp AT TIME ZONE 'UTC');
    FOREACH t IN ARRAY konduit_history_tables() LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I',
                       format('konduit_history_%s_p%s', t, to_char(p_day, 'YYYYMMDD')));
    END LOOP;
    RETURN n;
END
$$;
