-- Konduit schema, version 9: what a start pays per task.
-- Starting a 500-root execution inserts 500 task rows and 501 step rows in one statement. Each
-- row paid a foreign-key check against its execution, run row by row (a lookup and a lock per
-- row: about a third of the statement), and one more index insert than it needs.
-- The same two invariants now hold per statement instead of per row: an insert of tasks or
-- steps of no execution fails with foreign_key_violation (one anti-join over the statement's
-- new rows), and deleting executions deletes their tasks and steps (one delete each over the
-- statement's deleted rows; attempts follow their tasks by their own ON DELETE CASCADE).
-- Neither row kind ever moves to another execution (nothing updates execution_id).
DROP INDEX konduit_tasks_execution;  -- the unique (execution_id, step, map_index, generation) serves it
ALTER TABLE konduit_tasks DROP CONSTRAINT konduit_tasks_execution_id_fkey;
ALTER TABLE konduit_steps DROP CONSTRAINT konduit_steps_execution_id_fkey;

CREATE FUNCTION konduit_check_execution_exists() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
BEGIN
    SELECT n.execution_id INTO missing
    FROM new_rows n
    WHERE NOT EXISTS (SELECT 1 FROM konduit_executions e WHERE e.id = n.execution_id)
    LIMIT 1;
    IF FOUND THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('insert into %s refers to execution %s, which does not exist',
                             TG_TABLE_NAME, missing),
            TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER konduit_tasks_execution_exists
    AFTER INSERT ON konduit_tasks REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION konduit_check_execution_exists();
CREATE TRIGGER konduit_steps_execution_exists
    AFTER INSERT ON konduit_steps REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION konduit_check_execution_exists();

CREATE FUNCTION konduit_delete_execution_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM konduit_tasks t USING old_rows o WHERE t.execution_id = o.id;
    DELETE FROM konduit_steps s USING old_rows o WHERE s.execution_id = o.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER konduit_executions_delete_rows
    AFTER DELETE ON konduit_executions REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION konduit_delete_execution_rows();
