DO $$
BEGIN
    PERFORM set_config('lock_timeout', '10s', true);
    ALTER TABLE outbox ALTER COLUMN payload SET COMPRESSION default;
END
$$;
