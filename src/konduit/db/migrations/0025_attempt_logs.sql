-- Konduit schema, version 25: what a handler logged during an attempt, kept with the attempt.
--
-- One row per attempt that logged anything (most log nothing and have none), written in the
-- transaction that records the attempt's end. Bounded by the worker (200 records, 64 KiB of
-- messages per attempt; `dropped` counts the rest). It goes with its attempt, and so with its
-- execution when retention deletes that (ON DELETE CASCADE all the way down).
CREATE TABLE konduit_attempt_logs (
    lease_token  uuid    PRIMARY KEY REFERENCES konduit_attempts (lease_token) ON DELETE CASCADE,
    records      jsonb   NOT NULL CHECK (jsonb_typeof(records) = 'array'),
    dropped      integer NOT NULL DEFAULT 0 CHECK (dropped >= 0)
);
