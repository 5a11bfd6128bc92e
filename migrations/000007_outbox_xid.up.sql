-- The transaction that wrote the row. The relay records, as it goes, a
-- snapshot (pg_current_snapshot) once the streams hold every transaction
-- visible in it; a catch-up after a failover, or on a slot it cannot
-- trust, publishes the rows whose transaction that snapshot does not see,
-- whatever their created_at and however long their transaction stayed
-- open. Added without a default first, so that the rows already written
-- keep NULL (a change to the catalog only, not a rewrite of the table):
-- written before any snapshot the relay records, they are in it.
ALTER TABLE outbox ADD COLUMN xid xid8;
ALTER TABLE outbox ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
-- The catch-up reads the rows at or above a snapshot's xmin. Transaction
-- ids grow as rows are appended, so inserts land at the index's right
-- edge. (PostgreSQL has no block range operator class for xid8.)
CREATE INDEX outbox_xid ON outbox (xid);
