-- Konduit schema, version 38: durable streams (ctx.stream, docs/streams.md).
--
-- A stream is keyed by (execution_id, name): the default name is the step's (``step`` or
-- ``step[3]`` for an item of a map step), and it belongs to that one task (step, map_index):
-- a write from another task to the same name is refused. konduit_streams is its head: the next
-- offset to give (offsets are dense from 0), the data chunks and bytes kept (bounded by the
-- writer's limits), and the attempt writing it (writer_token, its lease). When another attempt
-- writes, its first write adds a restart record before its chunk (marker_offset is the offset
-- of the restart record the latest write added, NULL when it added none; previous_attempt the
-- attempt that wrote before the latest restart), so readers see where
-- a retried attempt started again; chunks of different attempts are never silently mixed.
-- konduit_stream_chunks holds the records, one per offset; (writer_token, seq) makes a write
-- that is sent again after an unanswered try a no-op. Both go with their execution (ON DELETE
-- CASCADE): retention prunes them with it. New tables only: workers of the previous release
-- never read or write them.
CREATE TABLE konduit_streams (
    execution_id      uuid         NOT NULL REFERENCES konduit_executions (id) ON DELETE CASCADE,
    name              text         NOT NULL CHECK (name <> ''),
    step              text         NOT NULL,
    map_index         integer      NOT NULL CHECK (map_index >= 0),
    next_offset       bigint       NOT NULL CHECK (next_offset >= 1),
    chunks            integer      NOT NULL CHECK (chunks >= 0),
    bytes             bigint       NOT NULL CHECK (bytes >= 0),
    writer_token      uuid         NOT NULL,
    writer_attempt    integer      NOT NULL CHECK (writer_attempt >= 1),
    previous_attempt  integer,
    restarts          integer      NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    marker_offset     bigint,
    created_at        timestamptz  NOT NULL DEFAULT konduit_now(),
    updated_at        timestamptz  NOT NULL DEFAULT konduit_now(),
    PRIMARY KEY (execution_id, name)
);

CREATE TABLE konduit_stream_chunks (
    execution_id      uuid         NOT NULL,
    name              text         NOT NULL,
    chunk_offset      bigint       NOT NULL CHECK (chunk_offset >= 0),
    kind              text         NOT NULL CHECK (kind IN ('data', 'restart')),
    attempt           integer      NOT NULL CHECK (attempt >= 1),
    previous_attempt  integer,
    writer_token      uuid         NOT NULL,
    seq               integer      NOT NULL CHECK (seq >= 0),
    payload           jsonb,
    written_at        timestamptz  NOT NULL DEFAULT konduit_now(),
    PRIMARY KEY (execution_id, name, chunk_offset),
    UNIQUE (execution_id, name, writer_token, seq),
    FOREIGN KEY (execution_id, name) REFERENCES konduit_streams (execution_id, name)
        ON DELETE CASCADE,
    CHECK ((kind = 'data') = (payload IS NOT NULL)),
    CHECK ((kind = 'restart') = (previous_attempt IS NOT NULL))
);
