-- Konduit schema, version 10: a finished execution wakes only the clients that wait for it.
-- NOTIFY costs every listening backend of the database a transaction (it reads the shared queue
-- whatever the channel), so a notification per finished execution was paid by every worker's
-- listener even when nobody waited. A client that waits sets this first (then reads the status,
-- so a finish that committed before it is seen either way), and a finish notifies only then.
ALTER TABLE konduit_executions ADD COLUMN finish_waited boolean NOT NULL DEFAULT false;
