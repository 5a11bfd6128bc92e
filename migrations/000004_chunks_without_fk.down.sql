-- Chunks whose document is gone (none when only the writer wrote, but the
-- table no longer forbids them) would make the constraint fail to return.
DELETE FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.key = c.key);
ALTER TABLE chunks ADD CONSTRAINT chunks_key_fkey FOREIGN KEY (key) REFERENCES documents (key) ON DELETE CASCADE;
