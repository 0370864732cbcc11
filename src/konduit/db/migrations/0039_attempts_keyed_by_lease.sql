-- Konduit schema, version 39: an attempt is keyed by its lease token; no index on its id.
--
-- Every claim inserts an attempt row, and each insert wrote an entry into each of the table's
-- three indexes: the identity id's primary key, the lease token's unique key and the task's
-- index. Nothing looks an attempt up by its id alone (a row is found by its lease token, or
-- among its task's attempts through konduit_attempts_task; the id only breaks ties in ORDER BY
-- started_at, a sort either way), so the lease token, unique already, is the primary key now and
-- the id's index is gone: one index entry fewer per attempt (about 70 bytes of WAL per task).
-- The id column stays (and is still filled in): workers of the previous release insert attempts
-- without naming it and order by it; their one lookup by id also names the task
-- (`a.id = ... AND a.task_id = ...`), which konduit_attempts_task serves.
--
-- The lease token's unique constraint becomes the primary key: the attempt logs' foreign key
-- depends on its index, so it is dropped and made again on the new one. The new index is built
-- here while writes to konduit_attempts wait (about half a second per million attempts on a
-- small machine); a big history can build it beforehand without blocking, by hand, with
-- CREATE UNIQUE INDEX CONCURRENTLY konduit_attempts_lease_token_pkey ON konduit_attempts
-- (lease_token), which this migration then takes as it is (docs/internals/schema.md).
CREATE UNIQUE INDEX IF NOT EXISTS konduit_attempts_lease_token_pkey
    ON konduit_attempts (lease_token);
ALTER TABLE konduit_attempt_logs DROP CONSTRAINT konduit_attempt_logs_lease_token_fkey;
ALTER TABLE konduit_attempts DROP CONSTRAINT konduit_attempts_pkey;
ALTER TABLE konduit_attempts DROP CONSTRAINT konduit_attempts_lease_token_key;
ALTER TABLE konduit_attempts
    ADD CONSTRAINT konduit_attempts_pkey PRIMARY KEY USING INDEX konduit_attempts_lease_token_pkey;
ALTER TABLE konduit_attempt_logs ADD CONSTRAINT konduit_attempt_logs_lease_token_fkey
    FOREIGN KEY (lease_token) REFERENCES konduit_attempts (lease_token) ON DELETE CASCADE;
