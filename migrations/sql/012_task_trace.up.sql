-- The trace context a task was created in (issue 15; docs/observability.md):
-- propagation headers (for OpenTelemetry, W3C traceparent and tracestate), a
-- JSON object of strings, written by the create and never changed after it
-- (the guard of 013_trace_guard says so), so that every run of the task, on
-- any node and after any recovery, continues the trace it was created in.
-- NULL when the engine has no trace injector, or the creating context
-- carried no trace.
ALTER TABLE {schema}.tasks
    ADD COLUMN trace jsonb CHECK (jsonb_typeof(trace) = 'object' AND octet_length(trace::text) <= 4096);
