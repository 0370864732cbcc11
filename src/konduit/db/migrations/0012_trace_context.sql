-- Konduit schema, version 12: the W3C trace context of the caller that started an execution
-- (`traceparent`, `tracestate` headers, see docs/observability.md), written by the start's own
-- INSERT when tracing is on and NULL otherwise. Workers make it the parent of every attempt's
-- span, so one execution is one trace and a handler's own spans nest under its attempt.
ALTER TABLE konduit_executions ADD COLUMN traceparent text, ADD COLUMN tracestate text;
