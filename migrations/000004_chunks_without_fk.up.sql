-- chunks.key no longer references documents.key. The writer writes a
-- document's chunks in the statement that writes the document, and never
-- deletes a document (a withdrawal is a tombstone), so the constraint only
-- cost: its check runs a query that each connection plans once and keeps,
-- and a connection opened while the table was small keeps checking every
-- chunk with a sequential scan of documents, which grows with the table
-- (measured: one full scan per write).
ALTER TABLE chunks DROP CONSTRAINT chunks_key_fkey;
