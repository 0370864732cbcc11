-- Konduit schema, version 34: an attempt's end is a heap-only (HOT) update.
--
-- An attempt row is inserted when its task is claimed and updated once when the attempt ends
-- (finished_at, outcome, error). Two partial indexes named those columns: the open attempts
-- (WHERE finished_at IS NULL, unique per task and hedge) and the successful ones (WHERE outcome =
-- 'succeeded', on finished_at). Any indexed column (key or predicate) that changes makes an
-- update non-HOT, and a non-HOT update writes a new entry into every index of the table: each
-- attempt's end wrote five index entries (WAL, and bloat for vacuum). Now no index names a
-- column that changes when an attempt ends:
--   * the open attempts of a task are found through konduit_attempts_task (a task has a handful
--     of attempts at most; its lease and hedge lease are the invariant that at most one attempt
--     of each kind is open, and every write that ends one re-checks it);
--   * no query read the successful attempts by finish time through their index any more (the
--     adaptive deadline reads recent tasks first, then their attempts by task).
-- The table keeps a quarter of each page free for the update to land beside its row.
DROP INDEX IF EXISTS konduit_attempts_open;
DROP INDEX IF EXISTS konduit_attempts_succeeded;
ALTER TABLE konduit_attempts SET (fillfactor = 75);
