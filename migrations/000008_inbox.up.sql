-- The inbox: documents handed over inside a producer's own transaction.
-- A producer inserts a row in the same transaction as its own rows, so
-- that both commit or roll back together; the writer, the only writer of
-- documents, chunks and the outbox, takes each committed row, applies it
-- exactly as PUT /v1/documents/{key} (or DELETE, for a withdrawal) is
-- applied, and deletes it in the same transaction. A row the writer
-- refuses stays, with the code and message the API would have answered,
-- for the producer to read: nothing handed over is dropped silently.
CREATE TABLE converge_inbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key             text NOT NULL,
    -- The body of PUT /v1/documents/{key} ({"version": N, "title": ...,
    -- "body": ..., "links": [...], "tags": [...], "meta": {...}}), kept
    -- as the producer wrote it (json, not jsonb); a withdrawal is
    -- {"version": N, "withdrawn": true}, as on the ingest subjects.
    document        json NOT NULL,
    handed_over_at  timestamptz NOT NULL DEFAULT now(),
    handed_over_by  name NOT NULL DEFAULT current_user,
    -- Set by the writer on a refusal: when, the API's error code
    -- (invalid_key, version_conflict, ...) and its message.
    refused_at      timestamptz,
    refused_code    text,
    refused_message text,
    CONSTRAINT converge_inbox_refusal_whole CHECK ((refused_at IS NULL) = (refused_code IS NULL))
);

-- The writer takes the pending rows in id order.
CREATE INDEX converge_inbox_pending ON converge_inbox (id) WHERE refused_at IS NULL;

-- Wakes the writers (LISTEN converge_inbox) when a transaction that
-- handed documents over commits: a notification is sent at commit, and
-- not at all on a rollback. Once per statement, whatever its row count.
CREATE FUNCTION converge_inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('converge_inbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER converge_inbox_notify AFTER INSERT ON converge_inbox
    FOR EACH STATEMENT EXECUTE FUNCTION converge_inbox_notify();
