-- Konduit schema, version 35: forks.
--
-- A fork (konduit.App.fork) is a new execution that copies the outputs of the steps a chosen
-- step depends on from an origin execution and runs the rest. It remembers where it came from:
-- forked_from is the origin's id and forked_at_step the step it was forked from, both set or
-- both NULL. No foreign key: the origin may be pruned before its forks, and the link is kept as
-- the id it was (the pages say when it is gone). The partial index lists an origin's forks.
ALTER TABLE konduit_executions
    ADD COLUMN forked_from uuid,
    ADD COLUMN forked_at_step text,
    ADD CONSTRAINT konduit_executions_forked CHECK ((forked_from IS NULL) = (forked_at_step IS NULL));
CREATE INDEX konduit_executions_forked_from ON konduit_executions (forked_from, created_at)
    WHERE forked_from IS NOT NULL;
