-- Konduit schema, version 47: a read of the history skips the days an execution cannot be in.
--
-- The history is partitioned by the day each execution finished (migration 0041). A read
-- through the konduit_<table>_all views plans and probes every day's partition: with a year
-- kept, the reads of one execution page took seconds. An execution finishes after it began,
-- and its id (a UUIDv7) carries when it began: so its rows, and those of the executions it
-- started (children) or that copied it (forks) or wait for it (its parent), can only be in
-- the days from then on.
--
-- konduit_history_from(id): a day before a UUIDv7 id was made (-infinity for another kind of
-- id: nothing skipped), the day's margin for the clocks of the machines that make ids.
-- Immutable (no time zone in its arithmetic), so applied to a statement's parameter it is a
-- constant when the statement is planned, and the partitions before it are pruned then.
--
-- konduit_<table>_since(from): the table's rows and those of its history from that day on (the
-- views' rows, less the history's partitions that ended before `from`), one for each of the
-- history's tables: an SQL function of one SELECT, which PostgreSQL inlines into the statement
-- that calls it, so the statement's conditions reach both sides as they reach a view's. For
-- the executions an execution is linked to (its parent, children, forks).
--
-- konduit_<table>_of(execution): where one execution's rows of the table can be, for a read of
-- them: the hot table's and the history's from the day before its id was made
-- (konduit_<table>_since(konduit_history_from(execution))). A recent execution's read plans
-- and probes a day or two of the history whatever the days kept. (A check that skips the
-- history for an execution in the hot tables would keep PostgreSQL from pushing a join's key
-- into the history's side: a read of attempts by their tasks would scan the day whole.)
--
-- Online: new functions.

CREATE FUNCTION konduit_history_from(p_id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN substr(p_id::text, 15, 1) = '7'
                THEN to_timestamp(('x' || lpad(substr(replace(p_id::text, '-', ''), 1, 12), 16,
                                               '0'))::bit(64)::bigint / 1000.0 - 86400)
                ELSE '-infinity'::timestamptz END
$$;

-- The day's bound stands outside the UNION ALL, on a column the hot side has NULL: so the
-- union is flattened and a join's key still reaches each side's index (a condition written on
-- the history's side of the union would make it a subquery that a join scans whole), and
-- PostgreSQL still prunes the history's days by it when the statement is planned.
DO $$
DECLARE
    t text;
    cols text;
    body text;
BEGIN
    FOREACH t IN ARRAY konduit_history_tables() LOOP
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
        INTO cols
        FROM pg_attribute a
        WHERE a.attrelid = ('konduit_' || t)::regclass AND a.attnum > 0 AND NOT a.attisdropped;
        body := format('SELECT %s FROM (SELECT %s, NULL::timestamptz AS history_finished_at '
                       'FROM %I UNION ALL SELECT %s, history_finished_at FROM %I) u '
                       'WHERE u.history_finished_at IS NULL OR u.history_finished_at >= %%s',
                       cols, cols, 'konduit_' || t, cols, 'konduit_history_' || t);
        EXECUTE format('CREATE FUNCTION %I(p_from timestamptz) RETURNS SETOF %I '
                       'LANGUAGE sql STABLE AS $f$ %s $f$',
                       'konduit_' || t || '_since', 'konduit_' || t, format(body, 'p_from'));
        EXECUTE format('CREATE FUNCTION %I(p_execution uuid) RETURNS SETOF %I '
                       'LANGUAGE sql STABLE AS $f$ %s $f$',
                       'konduit_' || t || '_of', 'konduit_' || t,
                       format(body, 'konduit_history_from(p_execution)'));
    END LOOP;
END
$$;
