ALTER TABLE outbox DROP COLUMN IF EXISTS emission;
DROP SEQUENCE IF EXISTS outbox_emission_seq;
