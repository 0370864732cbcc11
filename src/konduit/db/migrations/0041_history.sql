-- Konduit schema, version 41: history off the hot path, in tables partitioned by day.
--
-- A finished execution (succeeded, failed, timed out, cancelled; never one holding a dead
-- letter) that finished longer ago than the App's history_after= moves, with every row hanging
-- off it, out of the tables the workers write (the hot tables) into konduit_history_<table>:
-- tables of the same columns plus history_finished_at (the execution's finished_at; for
-- konduit_history_executions, its own finished_at), declaratively partitioned by range of it,
-- one partition per UTC day. Retention then drops a day's partitions (a catalog change) instead
-- of deleting rows one by one, and leaves no dead tuples behind in the hot tables but those of
-- the move itself, which vacuum takes in small steady steps.
--
-- konduit_<table>_all (a view: the hot table UNION ALL its history, the hot table's columns)
-- is what a read of one execution goes through, so an execution reads the same before and
-- after it moved. The claim, the round, the dashboard's recent lists and every write read the
-- hot tables only.
--
-- An idempotency key stays taken while its execution is in the history: a start looks for it
-- there too (konduit_history_executions_key), under the key's advisory lock
-- (konduit_history_key_lock), which the move takes too (and skips an execution whose key a
-- start holds): a start either sees the execution in the hot table, or waits for the move and
-- then sees it in the history.
--
-- Online: this migration creates empty tables, views and functions (no scan, no rewrite of a
-- hot table). What a database already keeps moves later, in batches, by the workers' history
-- pass, while workers run. Workers of the previous release never read the history: they find
-- a moved execution no more than a pruned one.

CREATE FUNCTION konduit_history_key_lock(p_workflow text, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended(p_workflow || chr(31) || p_key, 7478) $$;

DO $$
DECLARE
    t text;
    cols text;
    defs text;
BEGIN
    FOREACH t IN ARRAY ARRAY['executions', 'steps', 'tasks', 'attempts', 'attempt_logs',
                             'outputs', 'execution_outputs', 'journal', 'journal_results',
                             'streams', 'stream_chunks', 'map_chunks'] LOOP
        -- The hot table's columns, types and NOT NULLs (no defaults, keys or checks: a row
        -- comes here as it was).
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
               string_agg(format('%I %s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                                 CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END),
                          ', ' ORDER BY a.attnum)
        INTO cols, defs
        FROM pg_attribute a
        WHERE a.attrelid = ('konduit_' || t)::regclass AND a.attnum > 0 AND NOT a.attisdropped;
        EXECUTE format('CREATE TABLE %I (%s, history_finished_at timestamptz NOT NULL) '
                       'PARTITION BY RANGE (history_finished_at)', 'konduit_history_' || t, defs);
        EXECUTE format('CREATE VIEW %I AS SELECT %s FROM %I UNION ALL SELECT %s FROM %I',
                       'konduit_' || t || '_all', cols, 'konduit_' || t,
                       cols, 'konduit_history_' || t);
    END LOOP;
END
$$;

-- What a read of one execution looks its rows up by.
CREATE INDEX konduit_history_executions_id ON konduit_history_executions (id);
CREATE INDEX konduit_history_executions_key ON konduit_history_executions
    (workflow_name, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX konduit_history_steps_execution ON konduit_history_steps (execution_id);
CREATE INDEX konduit_history_tasks_execution ON konduit_history_tasks (execution_id);
CREATE INDEX konduit_history_tasks_id ON konduit_history_tasks (id);
CREATE INDEX konduit_history_attempts_task ON konduit_history_attempts (task_id);
CREATE INDEX konduit_history_attempts_lease ON konduit_history_attempts (lease_token);
CREATE INDEX konduit_history_attempt_logs_lease ON konduit_history_attempt_logs (lease_token);
CREATE INDEX konduit_history_outputs_execution ON konduit_history_outputs (execution_id);
CREATE INDEX konduit_history_execution_outputs_execution
    ON konduit_history_execution_outputs (execution_id);
CREATE INDEX konduit_history_journal_execution ON konduit_history_journal (execution_id);
CREATE INDEX konduit_history_journal_results_execution
    ON konduit_history_journal_results (execution_id);
CREATE INDEX konduit_history_streams_execution ON konduit_history_streams (execution_id);
CREATE INDEX konduit_history_stream_chunks_execution
    ON konduit_history_stream_chunks (execution_id);
CREATE INDEX konduit_history_map_chunks_execution ON konduit_history_map_chunks (execution_id);

-- The tables a day's history is kept in, in the order a move fills them.
CREATE FUNCTION konduit_history_tables() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ARRAY['executions', 'steps', 'tasks', 'attempts', 'attempt_logs', 'outputs',
                   'execution_outputs', 'journal', 'journal_results', 'streams',
                   'stream_chunks', 'map_chunks'] $$;

-- The partitions of one UTC day, made if missing (konduit_history_<table>_pYYYYMMDD). Creating
-- a partition locks its parent for a moment; a move makes its days' partitions before it
-- copies a row.
CREATE FUNCTION konduit_history_partition(p_day date) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY konduit_history_tables() LOOP
        IF to_regclass(format('konduit_history_%s_p%s', t, to_char(p_day, 'YYYYMMDD'))) IS NULL
        THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                           format('konduit_history_%s_p%s', t, to_char(p_day, 'YYYYMMDD')),
                           'konduit_history_' || t,
                           (p_day::timestamp AT TIME ZONE 'UTC'),
                           ((p_day + 1)::timestamp AT TIME ZONE 'UTC'));
        END IF;
    END LOOP;
END
$$;

-- Move these executions (locked by the caller, FOR UPDATE), with their rows, into the history;
-- returns those moved. Re-checks here what a move depends on: the execution is still finished,
-- and its idempotency key (if any) is not held by a start (the key's advisory lock, taken
-- without waiting: one a start holds is skipped, and moved by a later pass).
-- A lock it cannot get within 5 s (a partition's parent, that a long read of the history holds)
-- fails the move, which a later pass makes again.
CREATE FUNCTION konduit_history_move(p_ids uuid[])
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
    -- The rest of the rows go with the execution (its trigger and foreign keys).
    RETURN QUERY
        DELETE FROM konduit_executions e WHERE e.id = ANY(moved)
        RETURNING e.id, e.finished_at;
END
$$;

-- The days the history keeps (a partition of konduit_history_executions each), oldest first.
CREATE FUNCTION konduit_history_days() RETURNS SETOF date
LANGUAGE sql STABLE
AS $$
    SELECT to_date(right(c.relname, 8), 'YYYYMMDD') AS day
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'konduit_history_executions'::regclass
    ORDER BY 1
$$;

-- Drop one day of history: its partitions, every table's. Returns the executions it held.
-- Dropping a partition locks its parent: a long read of the history that holds it fails the
-- drop after 5 s (the next retention round drops the day), rather than queue every read behind.
CREATE FUNCTION konduit_history_drop_day(p_day date) RETURNS bigint
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
    FOREACH t IN ARRAY konduit_history_tables() LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I',
                       format('konduit_history_%s_p%s', t, to_char(p_day, 'YYYYMMDD')));
    END LOOP;
    RETURN n;
END
$$;
