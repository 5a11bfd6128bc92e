#!/usr/bin/env bash
# Creates converge's database and one role per job. The postgres image runs
# this once, when it initializes an empty data volume (it runs every script
# in /docker-entrypoint-initdb.d); to change a password afterwards, use
# ALTER ROLE, or remove the volume (`docker compose down -v`: this loses
# the data).
#
#   converge_owner   owns the database and its tables: `converge migrate up`
#                    runs as it, and creates the relay's replication slot with
#                    the schema (pg_create_logical_replication_slot needs
#                    REPLICATION). Then deploy/postgres/grants.sql grants the
#                    tables to the other roles.
#   converge_writer  the writer: DML on the tables, SELECT on the schema
#                    version; it creates nothing.
#   converge_relay   the relay: a logical replication connection (REPLICATION)
#                    to the converge_outbox publication, SELECT on outbox.
#   converge_reader  read-only: converge verify, converge status.
#
# These are the roles of internal/roles, which defines them once;
# `converge roles apply` makes any cluster hold them (and, unlike this
# script, takes back what they should not have).
#
# No other role may connect to the database. Passwords come from the
# environment (docker-compose.yml), never from this file.
set -e

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname postgres \
	--set owner_password="${CONVERGE_PG_OWNER_PASSWORD:?CONVERGE_PG_OWNER_PASSWORD is not set}" \
	--set writer_password="${CONVERGE_PG_WRITER_PASSWORD:?CONVERGE_PG_WRITER_PASSWORD is not set}" \
	--set relay_password="${CONVERGE_PG_RELAY_PASSWORD:?CONVERGE_PG_RELAY_PASSWORD is not set}" \
	--set reader_password="${CONVERGE_PG_READER_PASSWORD:?CONVERGE_PG_READER_PASSWORD is not set}" \
	<<'SQL'
CREATE ROLE converge_owner LOGIN REPLICATION PASSWORD :'owner_password';
CREATE ROLE converge_writer LOGIN PASSWORD :'writer_password';
CREATE ROLE converge_relay LOGIN REPLICATION PASSWORD :'relay_password';
CREATE ROLE converge_reader LOGIN PASSWORD :'reader_password';

CREATE DATABASE converge OWNER converge_owner;
REVOKE ALL ON DATABASE converge FROM PUBLIC;
GRANT CONNECT ON DATABASE converge TO converge_writer, converge_relay, converge_reader;

\connect converge
-- The public schema belongs to the database owner (pg_database_owner), so
-- converge_owner creates the tables in it; the others may only use it.
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO converge_writer, converge_relay, converge_reader;
SQL
