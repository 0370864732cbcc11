-- Konduit schema, version 14: one definition of "the worker holding this lease is alive", used by
-- every statement that reclaims a lease (tasks.sql, hedges.sql) instead of a copy in each.
--
-- Alive: registered, not stopped, heard from within its own lease length, and the lease itself
-- was extended within that length (a worker alive but wedged on one task does not keep it).
-- STABLE: it reads the calling statement's snapshot, exactly as the subquery it replaces did, so
-- the write that calls it re-checks liveness in its own statement (River #1302).
CREATE FUNCTION konduit_lease_holder_alive(holder text, lease_expires_at timestamptz)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM konduit_workers w
        WHERE w.id = holder AND w.stopped_at IS NULL
          AND w.last_heartbeat_at > clock_timestamp() - make_interval(secs => w.lease_seconds)
          AND lease_expires_at > clock_timestamp() - make_interval(secs => w.lease_seconds))
$$;
