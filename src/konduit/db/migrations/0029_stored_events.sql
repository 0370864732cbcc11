-- Konduit schema, version 29: stored events expire.
--
-- An event no task waits for yet is kept for a retention (the waiting step's `retention=`, else
-- the App's `event_retention`, 24 h by default) and consumed, oldest first, by the first task of
-- a matching step that starts waiting before `expires_at`; past it the event is never consumed
-- and the workers' maintenance deletes it. NULL: an event that woke a task at once, or one
-- stored before this version (kept, as then, until retention prunes it).
ALTER TABLE konduit_events ADD COLUMN expires_at timestamptz;

-- The maintenance deletes expired events by this index (only pending events are in it).
CREATE INDEX konduit_events_expiring ON konduit_events (expires_at)
    WHERE consumed_at IS NULL AND expires_at IS NOT NULL;
