-- name: execution_list_ids_by_prefix_or_tail
-- The executions whose id starts with the typed hex digits (an index range on the primary key)
-- or ends with them (the random tail the faces show: a prefix of the id's reversed text, on
-- its index of migration 0024), at most a few: one is the answer, more are listed as the
-- candidates of an ambiguous piece. Executions moved into the history (migration 0041) are
-- found alike, on its partitions' id and reversed-id indexes (migration 0042).
-- plan: custom, the reversed tail's LIKE uses its index only when planned with its value.
SELECT id
FROM (SELECT id FROM konduit_executions_all
      WHERE id BETWEEN %(low)s AND %(high)s
      UNION
      SELECT id FROM konduit_executions_all
      WHERE reverse(id::text) LIKE %(tail_reversed)s::text) found
ORDER BY id
LIMIT %(limit)s;
