-- name: replica_get_primary_wal_position
-- On the primary: how far its write-ahead log goes now, which a replica's replay is compared with.
SELECT pg_current_wal_lsn()::text AS lsn;

-- name: replica_get_replay_state
-- On a read replica: whether it is a standby, how many bytes of the primary's WAL (at
-- primary_lsn, read just before) it has not replayed yet, and the age of the last transaction
-- it replayed. An idle primary writes nothing, so that age alone would grow without any lag:
-- nothing left to replay means no lag, whatever the age.
SELECT pg_is_in_recovery() AS in_recovery,
       pg_wal_lsn_diff(%(primary_lsn)s::pg_lsn, pg_last_wal_replay_lsn())::float8 AS behind_bytes,
       extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 AS replay_age;

-- name: replica_ping
-- On a read replica: one round trip, to tell a read that is slow from a replica that stopped
-- answering.
SELECT 1 AS one;
