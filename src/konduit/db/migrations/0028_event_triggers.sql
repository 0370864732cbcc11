-- Konduit schema, version 28: events that start work (wf.on_event; docs/events.md).
--
-- konduit_event_triggers: what each registered workflow version declared (its spec: mode,
-- whether input=/key= are code, timings), so that a process without the workflow's code still
-- knows that an event starts something.
CREATE TABLE konduit_event_triggers (
    workflow_name    text        NOT NULL,
    workflow_version integer     NOT NULL,
    event            text        NOT NULL,
    spec             jsonb       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_version, event),
    FOREIGN KEY (workflow_name, workflow_version)
        REFERENCES konduit_workflows (name, version) ON DELETE CASCADE
);
CREATE INDEX konduit_event_triggers_event ON konduit_event_triggers (event);

-- One row per event a trigger took, written in the transaction of send_event: the record of
-- what the event started. 'pending' waits for a process with the workflow's code (input= and
-- key= are code): the sender's own when it has it (then it never stays pending), else a
-- worker's maintenance. 'started': its execution was created (or an earlier event of its key
-- had); 'gathered': it joined a debounce burst or a batch (group_id), then 'started' with
-- the group's execution_id once the group starts; 'failed': its code raised or its input was
-- refused (error).
CREATE TABLE konduit_trigger_events (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_name    text        NOT NULL,
    workflow_version integer     NOT NULL,
    event            text        NOT NULL,
    key              text,
    payload          jsonb,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'started', 'gathered', 'failed')),
    group_id         bigint,
    execution_id     uuid,
    error            text,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    done_at          timestamptz
);
CREATE INDEX konduit_trigger_events_pending ON konduit_trigger_events (id)
    WHERE status = 'pending';
-- A trigger's last event (the dashboard), and the records that retention may delete.
CREATE INDEX konduit_trigger_events_trigger
    ON konduit_trigger_events (workflow_name, event, id DESC);
CREATE INDEX konduit_trigger_events_done ON konduit_trigger_events (created_at)
    WHERE status IN ('started', 'failed');
CREATE INDEX konduit_trigger_events_group ON konduit_trigger_events (group_id)
    WHERE group_id IS NOT NULL;

-- An open debounce burst or batch: one per (workflow, event, key). Its start deletes it in the
-- transaction that creates the execution (the delete re-checks due_at), so it starts once.
CREATE TABLE konduit_trigger_groups (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_name    text        NOT NULL,
    workflow_version integer     NOT NULL,
    event            text        NOT NULL,
    mode             text        NOT NULL CHECK (mode IN ('debounce', 'batch')),
    group_key        text        NOT NULL,  -- '' for a trigger without a key
    inputs           jsonb       NOT NULL,  -- debounce: [the last input]; batch: every input
    size             integer     NOT NULL CHECK (size >= 1),
    last_event_at    timestamptz NOT NULL,
    opened_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    due_at           timestamptz NOT NULL,
    UNIQUE (workflow_name, event, group_key)
);
CREATE INDEX konduit_trigger_groups_due ON konduit_trigger_groups (due_at);
