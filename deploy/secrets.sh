#!/bin/sh
# Makes the secrets of the docker-compose.yml stack: deploy/secrets.sh [DIR]
# (DIR defaults to deploy/secrets, which git ignores and docker-compose.yml
# reads). `make up` runs it first; run it by hand before a plain
# `docker compose up`. It needs Go (the toolchain of go.mod) for the part
# made by deploy/secretgen: certificates and bcrypt hashes, which nothing in
# a default Debian makes, and the NATS users, which come from the code.
#
# Each password, token and key is random, made once, and kept: running the
# script again changes none of them (delete a file to have it made anew).
# The files derived from them (pgpass lines, tokens files, the NATS users,
# the Qdrant and Neo4j files, operator.env) are written again every run, so
# they always agree with the values they hold.
#
#   postgres-password     the Postgres superuser's (the postgres image sets it
#                         when it initializes the volume)
#   postgres-pgpass       the same, as a pgpass line, for the roles service
#   <role>-password       converge_<role>'s, for `converge roles apply`, which
#                         sets it (role: owner, writer, relay, reader, producer)
#   <role>-pgpass         the same as a pgpass line, for the service that logs
#                         in as converge_<role> (passfile= in its URL)
#   operator-token        the operator's bearer token (CONVERGE_TOKEN_FILE)
#   client-token          a client's: write to the writer, read the projectors
#   writer-tokens, projector-index-tokens, projector-graph-tokens
#                         the tokens file of each service with an API
#                         (CONVERGE_TOKENS_FILE)
#   webhook-secret        the notifier's signing secret: give it to the
#                         receivers (CONVERGE_WEBHOOK_SECRET_FILE)
#   qdrant-api-key        Qdrant's API key, for projector-index
#   qdrant-config.yaml    the same as Qdrant's configuration (local.yaml)
#   neo4j-password        the password of Neo4j's user neo4j, for
#                         projector-graph
#   neo4j-auth            the same as the neo4j image's NEO4J_AUTH_FILE
#   ca.crt, ca.key, <server>.crt, <server>.key
#                         the CA and the servers' certificates (deploy/secretgen)
#   nats-<user>-password, nats-users.conf
#                         a password per NATS user and the users, with their
#                         bcrypt hashes, for nats-server (deploy/secretgen)
#   operator.env          variables for converge on the host: Postgres as
#                         converge_reader, NATS as operator, the operator token,
#                         the CA of every service's certificate
#
# The values are hexadecimal: safe in URLs, pgpass lines and tokens files.
# Files are readable by all (the containers' users differ from yours and
# Compose mounts the files as they are; Postgres is given a copy of its key
# that only it can read); the directory is yours alone.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$repo/deploy/secrets}
if ! command -v go >/dev/null 2>&1; then
	echo "deploy/secrets.sh: go not found: Go (see go.mod) makes the certificates and the NATS users (deploy/secretgen)" >&2
	exit 1
fi
umask 022
mkdir -p "$dir"
chmod 700 "$dir"
dir=$(cd "$dir" && pwd)

# put NAME: stdin into DIR/NAME, replacing it in one step.
put() {
	cat >"$dir/$1.tmp"
	chmod 644 "$dir/$1.tmp"
	mv -f "$dir/$1.tmp" "$dir/$1"
}

# keep NAME: a random value into DIR/NAME unless it holds one already.
keep() {
	if [ ! -s "$dir/$1" ]; then
		printf '%s\n' "$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')" | put "$1"
	fi
}

# value NAME: the value kept in DIR/NAME.
value() { head -n 1 "$dir/$1"; }

keep postgres-password
printf '*:*:*:postgres:%s\n' "$(value postgres-password)" | put postgres-pgpass
for role in owner writer relay reader producer; do
	keep "$role-password"
	printf '*:*:*:converge_%s:%s\n' "$role" "$(value "$role-password")" | put "$role-pgpass"
done

keep operator-token
keep client-token
operator=$(value operator-token)
client=$(value client-token)
put writer-tokens <<EOF
# name    scopes       token (made by deploy/secrets.sh)
operator  admin,write  $operator
client    write        $client
EOF
for p in projector-index projector-graph; do
	put "$p-tokens" <<EOF
# name    scopes       token (made by deploy/secrets.sh)
operator  admin,read   $operator
client    read         $client
EOF
done

keep webhook-secret
keep qdrant-api-key
put qdrant-config.yaml <<EOF
# Made by deploy/secrets.sh from qdrant-api-key; mounted as Qdrant's
# config/local.yaml.
service:
  api_key: $(value qdrant-api-key)
EOF
keep neo4j-password
printf 'neo4j/%s\n' "$(value neo4j-password)" | put neo4j-auth

(cd "$repo" && go run ./deploy/secretgen "$dir")

put operator.env <<EOF
# . $dir/operator.env: converge on the host, against the docker-compose.yml stack.
export CONVERGE_POSTGRES_URL='postgres://converge_reader@127.0.0.1:5432/converge?sslmode=verify-full&sslrootcert=$dir/ca.crt&passfile=$dir/reader-pgpass'
export CONVERGE_NATS_URL=nats://127.0.0.1:4222
export CONVERGE_NATS_CA=$dir/ca.crt
export CONVERGE_NATS_USER=operator
export CONVERGE_NATS_PASSWORD_FILE=$dir/nats-operator-password
export CONVERGE_TOKEN_FILE=$dir/operator-token
export CONVERGE_TLS_CA=$dir/ca.crt
export CONVERGE_WRITER_URL=https://127.0.0.1:8080
export CONVERGE_PROJECTOR_INDEX_ADDR=https://127.0.0.1:9103
export CONVERGE_PROJECTOR_GRAPH_ADDR=https://127.0.0.1:9104
EOF

echo "secrets in $dir"
