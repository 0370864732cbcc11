-- Konduit schema, version 48: a max_running key's pending executions are admitted in the order
-- they began waiting.
--
-- The slot fill (execution_start_pending_in_run_slots) started a key's pending executions in
-- the order of their created_at, their first start. A repair or redrive runs a finished
-- execution again, and one started later (run_at=, delay=) waits only from its time: ordered by
-- their first start, each went ahead of executions that were already waiting.
--
-- konduit_executions.queued_at: when the execution last began waiting for a slot, set by a
-- repair or redrive (the reopen) and by the pass that starts a due started-later execution;
-- NULL for every other start, whose queue place is its created_at. Admission orders by
-- coalesce(queued_at, created_at), id. Workers of the previous release write no queued_at (their
-- re-runs queue by their first start, as before) and read executions by the old order's columns,
-- which the new index's leading columns still serve.
--
-- The history keeps the column (konduit_history_executions, added after its own columns: the
-- move inserts by name), and konduit_executions_all, konduit_executions_since and
-- konduit_executions_of return it (their bodies list the columns: made again here).
--
-- Online: nullable columns without a default (no rewrite, no scan). The history's table is
-- altered first, so that the wait for konduit_executions' lock (behind the workers' short
-- transactions) holds up reads of the history only. The index replacing
-- konduit_executions_run_key is partial (pending and running executions with a key) but its
-- build reads the table while writes to konduit_executions wait (seconds for millions of rows);
-- a big history can build it beforehand without blocking, by hand, with
-- CREATE INDEX CONCURRENTLY konduit_executions_run_queue ON konduit_executions (workflow_name,
-- run_key, status, (coalesce(queued_at, created_at)), id) WHERE run_key IS NOT NULL AND status
-- IN ('pending', 'running'), which this migration then takes as it is.
ALTER TABLE konduit_history_executions ADD COLUMN queued_at timestamptz;
ALTER TABLE konduit_executions ADD COLUMN queued_at timestamptz;
CREATE INDEX IF NOT EXISTS konduit_executions_run_queue
    ON konduit_executions (workflow_name, run_key, status, (coalesce(queued_at, created_at)), id)
    WHERE run_key IS NOT NULL AND status IN ('pending', 'running');
DROP INDEX konduit_executions_run_key;

-- The view and the functions of migrations 0041 and 0047, made again over the columns as they
-- are now (the new one last, as the view's replacement requires).
DO $$
DECLARE
    cols text;
    body text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    INTO cols
    FROM pg_attribute a
    WHERE a.attrelid = 'konduit_executions'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('CREATE OR REPLACE VIEW konduit_executions_all AS SELECT %s FROM '
                   'konduit_executions UNION ALL SELECT %s FROM konduit_history_executions',
                   cols, cols);
    body := format('SELECT %s FROM (SELECT %s, NULL::timestamptz AS history_finished_at '
                   'FROM konduit_executions UNION ALL SELECT %s, history_finished_at '
                   'FROM konduit_history_executions) u '
                   'WHERE u.history_finished_at IS NULL OR u.history_finished_at >= %%s',
                   cols, cols, cols);
    EXECUTE format('CREATE OR REPLACE FUNCTION konduit_executions_since(p_from timestamptz) '
                   'RETURNS SETOF konduit_executions LANGUAGE sql STABLE AS $f$ %s $f$',
                   format(body, 'p_from'));
    EXECUTE format('CREATE OR REPLACE FUNCTION konduit_executions_of(p_execution uuid) '
                   'RETURNS SETOF konduit_executions LANGUAGE sql STABLE AS $f$ %s $f$',
                   format(body, 'konduit_history_from(p_execution)'));
END
$$;
