-- Konduit schema, version 23: a workflow's declared input type, stored at registration.
--
-- Workflow(..., input=Model) keeps the JSON Schema of its input (Model.model_json_schema(), or
-- the schema dict given) beside the spec, so that a process without the workflow's code (the
-- code-less konduit.Client, the API of a dashboard started without --app) checks a start's
-- input exactly as the App does, before any row is written. NULL: the input is any JSON.
-- Not part of spec_hash: what a start accepts is policy, not the DAG's shape.
ALTER TABLE konduit_workflows ADD COLUMN input_schema jsonb;
