-- Konduit schema, version 32: a map's items are created in chunks, outside the fan-in.
--
-- A map of a million items used to be inserted whole in the completion round that fired it:
-- 15 s and more in which that round, and the worker that ran it, took no other work. The fan-in
-- now creates the first chunk of items and leaves the rest here, one row per chunk (its items as
-- one text, a JSON item per line, and every fact a task of it needs that was decided at fire
-- time: budgets, the window's cut as an absolute moment). Any worker takes a row with SKIP
-- LOCKED, inserts its tasks and deletes it in one transaction: a crash before the commit leaves
-- the row for the next taker, the commit leaves the tasks and no row, so an item is created
-- exactly once (the tasks' unique key guards it once more). The execution's own rows go with
-- it (ON DELETE CASCADE: retention), and an execution that ends deletes its chunks.
CREATE TABLE konduit_map_chunks (
    id                        bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id              uuid             NOT NULL
                              REFERENCES konduit_executions (id) ON DELETE CASCADE,
    step                      text             NOT NULL,
    generation                integer          NOT NULL,
    first_index               integer          NOT NULL,
    item_count                integer          NOT NULL CHECK (item_count > 0),
    items                     text             NOT NULL,
    queue                     text             NOT NULL,
    priority                  integer          NOT NULL,
    max_attempts              integer          NOT NULL,
    deadline_seconds          double precision,
    limited                   boolean          NOT NULL,
    policy_revision           integer,
    deadline_uncut_seconds    double precision,
    deadline_reserve_seconds  double precision,
    deadline_at               timestamptz,
    created_at                timestamptz      NOT NULL DEFAULT now(),
    UNIQUE (execution_id, step, generation, first_index)
);
