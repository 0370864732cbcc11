-- name: schema_version_table_create_if_absent
-- The table that records which numbered migrations were applied.
CREATE TABLE IF NOT EXISTS konduit_schema_version (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: schema_version_lock
-- Serialize concurrent migrators for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtext('konduit_migrate'));

-- name: schema_version_get
-- The highest applied migration, or 0 when there is none (check the table exists first).
SELECT COALESCE(max(version), 0) AS version FROM konduit_schema_version;

-- name: schema_version_list
-- Every applied migration's number and name (check the table exists first).
SELECT version, name FROM konduit_schema_version ORDER BY version;

-- name: schema_version_table_exists
-- Whether the database has ever been migrated.
SELECT to_regclass('konduit_schema_version') IS NOT NULL AS present;

-- name: schema_version_insert
-- Record one applied migration.
INSERT INTO konduit_schema_version (version, name) VALUES (%(version)s, %(name)s);

-- name: schema_version_drop_everything
-- `konduit db reset`: every konduit table (with its rows, indexes and sequences) and function
-- in the current schema, the migrations' record included, so that migrating starts afresh.
-- Only names konduit gives its objects are touched; the caller holds schema_version_lock.
DO $$
DECLARE
    object record;
BEGIN
    FOR object IN
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
          AND starts_with(c.relname, 'konduit_')
    LOOP
        EXECUTE 'DROP TABLE IF EXISTS ' || quote_ident(object.relname) || ' CASCADE';
    END LOOP;
    FOR object IN
        SELECT p.oid::regprocedure AS signature FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND starts_with(p.proname::text, 'konduit_')
    LOOP
        EXECUTE 'DROP FUNCTION IF EXISTS ' || object.signature::text || ' CASCADE';
    END LOOP;
END
$$;
