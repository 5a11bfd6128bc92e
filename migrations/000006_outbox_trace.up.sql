-- The W3C trace context (traceparent) of the request that wrote the row,
-- when it had one or the writer traced it: the relay publishes it as the
-- event message's traceparent header, so that the projectors and the
-- notifier continue the writer's trace. NULL: no trace. A nullable column
-- without a default is a change to the catalog only.
ALTER TABLE outbox ADD COLUMN trace_context text;
