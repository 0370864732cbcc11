-- Konduit schema, version 20: the task guards (lease, rescue, deadline), each defined once.
--
-- Every write of a task re-checks in its own WHERE that the task is still what its caller read:
-- its lease, its lease's expiry, its deadline (River #1302). The same conditions stood in
-- several statements (tasks.sql, hedges.sql, leases.sql, waits.sql, batches.sql); a copy that
-- drifts is a fence with a hole. They are SQL functions
-- now, called by each statement in its own WHERE, so each write still re-checks at the time of
-- its own statement.
--
-- They must cost nothing on the hot path: each is a LANGUAGE sql function of one expression,
-- neither STRICT nor SECURITY DEFINER, with no SET clause, that uses each argument in a way
-- the planner accepts (every argument a column or a bind parameter), so PostgreSQL inlines it:
-- the planner sees the very expression the statement held before, and the plans are the same
-- (the index conditions and partial-index predicates included).
-- Volatility as correct for the body, which inlining requires too: the token guards read only
-- their arguments (IMMUTABLE); the others read clock_timestamp(), which is VOLATILE, so they
-- are (declared STABLE, they would not be inlined). tests/test_queries_fitness.py holds that no
-- plan of a statement that calls one still calls it.

-- The task runs under this lease: `lease_token` is the one the caller names (the task's lease,
-- or its hedge's where a hedge is rescued); the other lease's token is not enough (see the
-- next one).
CREATE FUNCTION konduit_lease_held(status text, lease_token uuid, token uuid)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT lease_token = token AND status = 'running'
$$;

-- The task runs under this token, as its lease or its hedge's (docs/hedging.md): whichever
-- attempt holds it.
CREATE FUNCTION konduit_lease_or_hedge_held(status text, lease_token uuid, hedge_token uuid,
                                            token uuid)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT token = ANY(ARRAY[lease_token, hedge_token]) AND status = 'running'
$$;

-- The task runs under one of these tokens, as its lease or its hedge's (a heartbeat's batch).
CREATE FUNCTION konduit_lease_or_hedge_held_any(status text, lease_token uuid, hedge_token uuid,
                                                tokens uuid[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT (lease_token = ANY(tokens) OR hedge_token = ANY(tokens)) AND status = 'running'
$$;

-- A lease ran out and its holder is not a live worker whose lease ran out less than a lease
-- ago (konduit_lease_holder_alive: a heartbeat may be about to land).
CREATE FUNCTION konduit_lease_lapsed(holder text, lease_expires_at timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT lease_expires_at < clock_timestamp()
       AND NOT konduit_lease_holder_alive(holder, lease_expires_at)
$$;

-- A lease may be taken from its holder now: it lapsed, and the server has been up for a lease
-- (after a restart, a live worker's heartbeat may not have reached the new server yet).
CREATE FUNCTION konduit_lease_rescuable(holder text, lease_expires_at timestamptz,
                                        lease_seconds float8)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT konduit_lease_lapsed(holder, lease_expires_at)
       AND pg_postmaster_start_time() < clock_timestamp() - make_interval(secs => lease_seconds)
$$;

-- A wait of `seconds` from now (a retry's backoff) ends before the task's deadline, if it has
-- one: else the caller ends the task instead of making it ready again.
CREATE FUNCTION konduit_deadline_after(deadline_at timestamptz, seconds float8)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT deadline_at IS NULL
        OR deadline_at > clock_timestamp() + make_interval(secs => seconds)
$$;

-- A caller that did not run the task's fallback (settle_seconds set) never ends a task whose
-- fallback another worker started less than that long ago: that one's outcome is coming.
CREATE FUNCTION konduit_fallback_settled(fallback_started_at timestamptz, settle_seconds float8)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT settle_seconds IS NULL OR fallback_started_at IS NULL
        OR fallback_started_at < clock_timestamp() - make_interval(secs => settle_seconds)
$$;

-- The task has no deadline, or it has not passed.
CREATE FUNCTION konduit_deadline_ahead(deadline_at timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT deadline_at IS NULL OR deadline_at > clock_timestamp()
$$;
