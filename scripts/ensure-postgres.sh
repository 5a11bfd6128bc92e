#!/usr/bin/env bash
# Ensures PostgreSQL server binaries (initdb, pg_ctl, postgres) are available
# for internal/pgcluster, installing postgresql-15 with apt-get when running
# as root. Idempotent and silent when everything is already present.
#
# Lookup order matches internal/pgcluster: $CONVERGE_PG_BINDIR,
# `pg_config --bindir`, initdb on $PATH, newest /usr/lib/postgresql/*/bin.
set -euo pipefail

has_binaries() {
	local dir=$1
	[[ -n $dir && -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]]
}

# find_bindir prints the binary directory and succeeds, or fails silently.
find_bindir() {
	if [[ -n ${CONVERGE_PG_BINDIR:-} ]]; then
		# Authoritative, as in pgcluster: a wrong value is an error, not a hint.
		has_binaries "$CONVERGE_PG_BINDIR" && { echo "$CONVERGE_PG_BINDIR"; return 0; }
		return 1
	fi
	local dir
	if command -v pg_config >/dev/null 2>&1; then
		dir=$(pg_config --bindir 2>/dev/null || true)
		has_binaries "$dir" && { echo "$dir"; return 0; }
	fi
	if command -v initdb >/dev/null 2>&1; then
		dir=$(dirname "$(readlink -f "$(command -v initdb)")")
		has_binaries "$dir" && { echo "$dir"; return 0; }
	fi
	# Newest major version first (numeric sort, so 15 beats 9.6).
	for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -rn); do
		has_binaries "$dir" && { echo "$dir"; return 0; }
	done
	return 1
}

ensure_postgres_user() {
	# initdb refuses to run as root, so pgcluster runs the server as "postgres".
	if [[ $(id -u) -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
		useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
	fi
}

if find_bindir >/dev/null; then
	ensure_postgres_user
	exit 0
fi

if [[ -n ${CONVERGE_PG_BINDIR:-} ]]; then
	echo "ensure-postgres: CONVERGE_PG_BINDIR=$CONVERGE_PG_BINDIR does not contain initdb, pg_ctl and postgres" >&2
	exit 1
fi

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-postgres: PostgreSQL server binaries not found (looked in pg_config --bindir, initdb on \$PATH, /usr/lib/postgresql/*/bin)." >&2
	echo "ensure-postgres: install postgresql-15 (e.g. sudo apt-get install postgresql-15) or set CONVERGE_PG_BINDIR to the directory holding initdb, pg_ctl and postgres." >&2
	exit 1
fi

echo "ensure-postgres: installing PostgreSQL server packages with apt-get..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if ! apt-get install -y -qq postgresql-15 >/dev/null; then
	echo "ensure-postgres: postgresql-15 unavailable, installing the distribution default 'postgresql'" >&2
	apt-get install -y -qq postgresql >/dev/null
fi

if ! dir=$(find_bindir); then
	echo "ensure-postgres: PostgreSQL packages installed but initdb, pg_ctl and postgres still not found" >&2
	exit 1
fi
ensure_postgres_user
echo "ensure-postgres: PostgreSQL server binaries in $dir" >&2
