-- fragment: execution_matches_search
-- An execution (of the hot table or of the history: the same columns) matching a filter
-- (konduit.core.search.ExecutionFilter), older than the cursor (created_at, id) of the previous
-- page's last row. Each given part is one index of migration 0024 (of 0044 in the history):
-- the start of an id a range of the primary key, its end a prefix of the reversed text, tags
-- and input a containment on their GIN indexes, the key a btree, the time range created_at,
-- the fair key its partial btree (migration 0027). A part not given is NULL and folds away
-- when the statement is planned.
(%(id_low)s::uuid IS NULL
     OR id BETWEEN %(id_low)s::uuid AND %(id_high)s::uuid
     OR reverse(id::text) LIKE %(id_tail)s::text)
AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s::text)
AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
AND (%(input)s::jsonb IS NULL OR input @> %(input)s::jsonb)
AND (%(status)s::text IS NULL OR status = %(status)s::text)
AND (%(workflow_name)s::text IS NULL OR workflow_name = %(workflow_name)s::text)
AND (%(workflow_version)s::int IS NULL OR workflow_version = %(workflow_version)s::int)
AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
AND (%(fair_key)s::text IS NULL OR fair_key = %(fair_key)s::text)
AND (%(before_at)s::timestamptz IS NULL
     OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))

-- name: execution_search
-- Executions of the hot table matching a filter (execution_matches_search), newest first: what
-- a bulk action acts on (an execution moved into the history takes no write).
-- plan: custom, a part left NULL must fold away for its neighbours' indexes to be chosen, and
-- how many rows a tag or an input field matches decides between its index and created_at's.
SELECT id, workflow_name, workflow_version, status, error, idempotency_key, created_at,
       finished_at, tags, run_at, priority, fair_key
FROM konduit_executions
WHERE {{execution_matches_search}}
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: execution_search_with_history
-- Executions matching a filter (execution_matches_search), newest first, of the hot table and
-- of the history (migration 0041) alike: what every face's search and list shows. One
-- statement, so one snapshot: an execution a move takes meanwhile is found once, on one side
-- or the other. Each side is a page of its own, merged; a day of the history that ended before
-- `since` cannot hold an execution created after it, so its partitions are pruned.
-- plan: custom, as execution_search.
SELECT *
FROM ((
    SELECT id, workflow_name, workflow_version, status, error, idempotency_key, created_at,
           finished_at, tags, run_at, priority, fair_key
    FROM konduit_executions
    WHERE {{execution_matches_search}}
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
) UNION ALL (
    SELECT id, workflow_name, workflow_version, status, error, idempotency_key, created_at,
           finished_at, tags, run_at, priority, fair_key
    FROM konduit_history_executions
    WHERE {{execution_matches_search}}
      AND (%(since)s::timestamptz IS NULL OR history_finished_at >= %(since)s::timestamptz)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
)) AS found
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;
