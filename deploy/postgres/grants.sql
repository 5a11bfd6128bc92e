-- Table privileges of converge's roles (created by
-- deploy/postgres/init/10-converge-roles.sh). The grants service of
-- docker-compose.yml runs this as converge_owner, the owner of the tables,
-- after every `converge migrate up`; granting again is a no-op. A migration
-- that adds a table or a sequence adds its grants here (the test in deploy/
-- checks that the writer is granted every table and sequence the
-- migrations create). The grants are those of internal/roles, where they
-- are defined and checked against Postgres' catalog; `converge migrate up`
-- re-applies them there too.

-- The writer is the only writer of the tables. SELECT because upserts
-- (ON CONFLICT ... WHERE) and deletes read the rows they change.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE documents, chunks, outbox TO converge_writer;
-- Re-emissions number their outbox rows from this sequence (nextval).
GRANT USAGE ON SEQUENCE outbox_emission_seq TO converge_writer;
-- Its readiness check reads the schema version; it never changes it.
GRANT SELECT ON TABLE schema_migrations TO converge_writer;

-- The relay reads the outbox through the converge_outbox publication, and
-- counts its rows when it has to create the slot itself.
GRANT SELECT ON TABLE outbox TO converge_relay;

-- converge verify and converge status only read.
GRANT SELECT ON TABLE documents, chunks, outbox, schema_migrations TO converge_reader;
