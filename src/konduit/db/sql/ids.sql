-- name: execution_list_ids_by_prefix_or_tail
-- The executions whose id starts with the typed hex digits (an index range on the primary key)
-- or ends with them (the random tail the faces show; a scan: there is no index on the tail),
-- at most a few: one is the answer, more are listed as the candidates of an ambiguous piece.
-- plan: custom, the tail match reads every execution's id.
SELECT id
FROM (SELECT id FROM konduit_executions
      WHERE id BETWEEN %(low)s AND %(high)s
      UNION
      SELECT id FROM konduit_executions
      WHERE right(replace(id::text, '-', ''), %(tail_length)s) = %(tail)s) found
ORDER BY id
LIMIT %(limit)s;
