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

-- name: schema_version_table_exists
-- Whether the database has ever been migrated.
SELECT to_regclass('konduit_schema_version') IS NOT NULL AS present;

-- name: schema_version_insert
-- Record one applied migration.
INSERT INTO konduit_schema_version (version, name) VALUES (%(version)s, %(name)s);
