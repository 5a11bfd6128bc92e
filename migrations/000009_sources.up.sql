-- Sources: tables a team already has, mapped to documents (converge
-- source apply). A mapped table's triggers hand over, in the changing
-- transaction, which rows changed (converge_inbox rows with source and
-- row_id set, and no document); the writer reads each such row's
-- current document through the source's view (converge_source_<name>,
-- created by converge source apply) and applies it as a PUT (a row gone
-- from the view, as a withdrawal), at the next version of its key.
ALTER TABLE converge_inbox
    ALTER COLUMN key DROP NOT NULL,
    ALTER COLUMN document DROP NOT NULL,
    -- The source's name and the changed row's identity, as text.
    ADD COLUMN source text,
    ADD COLUMN row_id text,
    ADD CONSTRAINT converge_inbox_kind CHECK (
        (source IS NULL AND row_id IS NULL AND key IS NOT NULL AND document IS NOT NULL)
        OR (source IS NOT NULL AND row_id IS NOT NULL AND document IS NULL));

-- Which document each mapped row gave, kept by the writer: a row deleted
-- (or gone from its source's view) withdraws it, a row whose key changed
-- withdraws the old key. One row per key: two rows giving the same key
-- are refused. The check is at commit, so that rows may trade keys in
-- one transaction.
CREATE TABLE converge_mapped_rows (
    source text NOT NULL,
    row_id text NOT NULL,
    key    text NOT NULL,
    PRIMARY KEY (source, row_id),
    CONSTRAINT converge_mapped_rows_key UNIQUE (key) DEFERRABLE INITIALLY DEFERRED
);

-- The trigger function of mapped tables: FOR EACH STATEMENT with
-- transition tables converge_new and converge_old, as converge source
-- apply creates them; TG_ARGV[0] is the source's name, TG_ARGV[1] the
-- column that gives the row's identity. One INSERT per statement,
-- however many rows it changed. It runs as whoever changed the table,
-- who therefore hands over (INSERT on converge_inbox: converge_producer).
CREATE FUNCTION converge_source_changed() RETURNS trigger LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
DECLARE
    ids text;
BEGIN
    ids := CASE TG_OP
        WHEN 'INSERT' THEN format('SELECT (%I)::text FROM converge_new', TG_ARGV[1])
        WHEN 'DELETE' THEN format('SELECT (%I)::text FROM converge_old', TG_ARGV[1])
        ELSE format('SELECT (%I)::text FROM converge_new UNION SELECT (%I)::text FROM converge_old', TG_ARGV[1], TG_ARGV[1])
    END;
    EXECUTE format('INSERT INTO converge_inbox (source, row_id) SELECT DISTINCT $1, id FROM (%s) AS changed(id) WHERE id IS NOT NULL', ids)
        USING TG_ARGV[0];
    RETURN NULL;
END
$$;

-- A TRUNCATE of a mapped table would change rows without their
-- withdrawals: refused, naming the way that keeps them.
CREATE FUNCTION converge_source_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'converge: % is mapped to documents by source %: TRUNCATE would skip their withdrawals; DELETE its rows instead', TG_TABLE_NAME, TG_ARGV[0]
        USING ERRCODE = 'feature_not_supported';
END
$$;
