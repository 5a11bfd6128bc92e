ALTER TABLE outbox DROP COLUMN IF EXISTS trace_context;
