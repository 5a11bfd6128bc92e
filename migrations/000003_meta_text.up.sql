-- The document's meta exactly as its event carries it (canonical JSON).
-- meta (jsonb) keeps a number's value but not its spelling (1e2 reads back
-- as 100), so an event rebuilt from meta alone may hash differently from
-- the original; re-emission reads meta_text instead. NULL for rows written
-- before this version: re-emission then falls back to meta and to the
-- original outbox row while retention keeps it.
ALTER TABLE documents ADD COLUMN meta_text text;
