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
-- that calls it, so the statement's conditions reach both sides as they reach a view's.
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

DO $$
DECLARE
    t text;
    cols text;
BEGIN
    FOREACH t IN ARRAY konduit_history_tables() LOOP
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
        INTO cols
        FROM pg_attribute a
        WHERE a.attrelid = ('konduit_' || t)::regclass AND a.attnum > 0 AND NOT a.attisdropped;
        EXECUTE format('CREATE FUNCTION %I(p_from timestamptz) RETURNS SETOF %I '
                       'LANGUAGE sql STABLE AS $f$ SELECT %s FROM %I UNION ALL SELECT %s FROM %I '
                       'WHERE history_finished_at >= p_from $f$',
                       'konduit_' || t || '_since', 'konduit_' || t, cols, 'konduit_' || t,
                       cols, 'konduit_history_' || t);
    END LOOP;
END
$$;
