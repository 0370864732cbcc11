-- Konduit schema, version 15: the stall watchdog (docs/alerts.md, "execution_stalled").
-- The silent failure is an execution left `running` with nothing that can move it: every task
-- ended, the fan-in decision that should have followed never ran. The maintenance pass of every
-- worker looks for such executions, re-runs the decision under the execution lock, and records
-- each stall as an alert of its own kind.

ALTER TABLE konduit_alerts DROP CONSTRAINT konduit_alerts_kind_check;
ALTER TABLE konduit_alerts ADD CONSTRAINT konduit_alerts_kind_check
    CHECK (kind IN ('window_at_risk', 'fan_in_wait', 'no_success', 'execution_stalled'));

-- "Has this execution a task that can still run?" must be one index probe, not a walk over the
-- execution's tasks (a map of 100,000 items would make every pass read 100,000 rows). Only
-- unfinished tasks are in it, so it stays as small as the live work; status changes are never
-- HOT updates anyway (status is in the predicates of the other partial indexes).
CREATE INDEX konduit_tasks_live ON konduit_tasks (execution_id)
    WHERE status IN ('ready', 'running', 'waiting');

-- The watchdog walks the running executions in id order, a bounded window per pass, resuming
-- after the last one it looked at (a keyset: no OFFSET, no re-reading of finished executions).
CREATE INDEX konduit_executions_running_id ON konduit_executions (id) WHERE status = 'running';

-- konduit_stalls_total: every stall the watchdog found, per workflow and whether the decision
-- healed it. A counter that never goes down (retention prunes alerts, never these).
CREATE TABLE konduit_stalls (
    workflow  text    NOT NULL,
    healed    boolean NOT NULL,
    stalls    bigint  NOT NULL DEFAULT 0 CHECK (stalls >= 0),
    PRIMARY KEY (workflow, healed)
);
