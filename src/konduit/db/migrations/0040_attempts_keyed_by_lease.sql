-- Konduit schema, version 40: an attempt is keyed by its lease token; no index on its id.
--
-- Every claim inserts an attempt row, and each insert wrote an entry into each of the table's
-- three indexes: the identity id's primary key, the lease token's unique key and the task's
-- index. Nothing looks an attempt up by its id (a row is found by its lease token, or among its
-- task's attempts through konduit_attempts_task; the id only breaks ties in ORDER BY
-- started_at, a sort either way), so the lease token, unique already, is the primary key now and
-- the id's index is gone: one index entry fewer per attempt (about 64 bytes of WAL per task).
-- The id column stays (and is still filled in): workers of the previous release insert attempts
-- without naming it and order by it; their lookups of an attempt by id also name its task
-- (`a.id = ... AND a.task_id = ...`), which konduit_attempts_task serves.
--
-- The lease token's unique constraint becomes the primary key: the attempt logs' foreign key
-- depends on that index, so it is dropped and made again on the new one (one index build over
-- the attempts, one check of the logs against them).
ALTER TABLE konduit_attempt_logs DROP CONSTRAINT konduit_attempt_logs_lease_token_fkey;
ALTER TABLE konduit_attempts DROP CONSTRAINT konduit_attempts_pkey;
ALTER TABLE konduit_attempts DROP CONSTRAINT konduit_attempts_lease_token_key;
ALTER TABLE konduit_attempts ADD CONSTRAINT konduit_attempts_pkey PRIMARY KEY (lease_token);
ALTER TABLE konduit_attempt_logs ADD CONSTRAINT konduit_attempt_logs_lease_token_fkey
    FOREIGN KEY (lease_token) REFERENCES konduit_attempts (lease_token) ON DELETE CASCADE;
