-- Re-emission: an outbox row written again for a document version whose
-- event was emitted before (converge backfill, converge verify --repair),
-- so that the relay publishes it again and the projections rewrite it.
-- emission is 0 for the original emission and a fresh value of
-- outbox_emission_seq for each re-emission. The relay publishes a
-- re-emission under the message id "<event id>.<emission>", so that the
-- stream's duplicate window does not drop it as a copy of the original,
-- and marks it as a repair, so that projections holding the same version
-- write it again.
CREATE SEQUENCE outbox_emission_seq;
ALTER TABLE outbox ADD COLUMN emission bigint NOT NULL DEFAULT 0;
