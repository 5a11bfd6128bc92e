-- The current version of every document, including tombstones. One row per
-- key: a withdrawal keeps the row (deleted = true) so that a replayed older
-- upsert finds a newer version and cannot resurrect the document.
CREATE TABLE documents (
    key          text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 512),
    version      bigint      NOT NULL CHECK (version > 0),
    deleted      boolean     NOT NULL DEFAULT false,
    title        text        NOT NULL DEFAULT '',
    links        text[]      NOT NULL DEFAULT '{}',
    tags         text[]      NOT NULL DEFAULT '{}',
    meta         jsonb       NOT NULL DEFAULT '{}',
    content_hash text        NOT NULL,
    chunk_count  integer     NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- The chunks of each document's current version. The body is their
-- concatenation in ordinal order; it is not stored twice. id is the derived
-- chunk id, uuid5(ChunkNS, key:version:ordinal).
CREATE TABLE chunks (
    id           uuid    PRIMARY KEY,
    key          text    NOT NULL REFERENCES documents (key) ON DELETE CASCADE,
    version      bigint  NOT NULL,
    ordinal      integer NOT NULL CHECK (ordinal >= 0),
    text         text    NOT NULL CHECK (text <> ''),
    content_hash text    NOT NULL
);
CREATE INDEX chunks_key_ordinal ON chunks (key, ordinal);

-- The transactional outbox: one row per applied (key, version, kind), written
-- in the same transaction as the document. payload is the canonical event
-- JSON; the json type keeps its bytes exactly as written.
CREATE TABLE outbox (
    event_id   uuid        PRIMARY KEY,
    key        text        NOT NULL,
    version    bigint      NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('document.upserted', 'document.withdrawn')),
    payload    json        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_created_at ON outbox (created_at);

-- The relay reads inserts into the outbox, and nothing else, through this
-- publication. Deletes (retention) are not published.
CREATE PUBLICATION converge_outbox FOR TABLE outbox WITH (publish = 'insert');
