// Package roles is converge's PostgreSQL roles and their privileges, as one
// definition ([Definition]), and the administrator's step that makes a
// cluster hold exactly that ([Apply], `converge roles apply`):
//
//	converge_owner   owns the schema's objects: `converge migrate up` runs as
//	                 it; REPLICATION, so that migrate up creates the relay's
//	                 slot with the schema
//	converge_writer  the only writer of the tables: SELECT, INSERT, UPDATE,
//	                 DELETE on documents, chunks and outbox, USAGE on
//	                 outbox_emission_seq, SELECT on schema_migrations
//	converge_relay   REPLICATION, and SELECT on outbox: it streams the
//	                 converge_outbox publication from its slot
//	converge_reader  SELECT on the tables: `converge verify`, `converge status`
//
// Apply is idempotent and exact: it creates what is missing and takes back
// what the definition does not grant (attributes, memberships, privileges on
// the database, the schema and its tables), so running it again after a
// drift restores the definition. Everything inside the database happens in
// one transaction; only CREATE DATABASE, which Postgres cannot run in one,
// comes before it.
//
// Tables that a migration creates later are granted by [Grant], which
// schema.Up runs after every migration as the owner of what it created; the
// privileges of a role that does not exist are skipped, so a database run by
// one superuser role keeps working.
//
// REPLICATION, which the relay and the owner hold, grants more than their
// slot: on PostgreSQL 15 such a role may create slots with any output
// plugin and decode every table of a database it may connect to (a
// publication limits pgoutput alone), drop any slot, create physical slots,
// and take a base backup of the whole cluster over the same logical
// replication connection the relay streams on (TestReplicationGrantsMoreThanTheRelaysSlot).
// Postgres cannot scope the attribute; [HBA] writes the pg_hba.conf lines
// that limit what can be limited: each REPLICATION role to converge's
// database from its own address over TLS, and no converge role to another
// database or to physical replication. docs/security.md says what remains.
//
// Passwords come from the caller. A role given none keeps the one it has; a
// role created without one has none, so password authentication refuses it
// until one is set. A password is sent as its SCRAM-SHA-256 verifier,
// computed here: the password itself never reaches the server (nor its
// statement log), and [Plan] shows a placeholder in its place.
package roles
