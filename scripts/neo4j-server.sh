#!/usr/bin/env bash
# A real Neo4j 5 Community server on 127.0.0.1, built from Maven Central
# (test/neo4j) and started without Docker.
#
#   scripts/neo4j-server.sh start DIR   build if needed, start, wait until Bolt
#                                       answers, print the CONVERGE_NEO4J_* lines
#   scripts/neo4j-server.sh stop DIR    stop it cleanly (SIGTERM, then SIGKILL)
#   scripts/neo4j-server.sh run -- CMD  start in a temporary DIR, run CMD with
#                                       CONVERGE_TEST_NEO4J_{URL,URLS,USER,PASSWORD,CA,DIR}
#                                       exported, stop, exit with CMD's status
#   scripts/neo4j-server.sh run --services -- CMD
#                                       the same, with CONVERGE_NEO4J_URL, _USER and
#                                       _PASSWORD exported instead: CMD's services
#                                       put the graph in this Neo4j (make demo-neo4j)
#   scripts/neo4j-server.sh build       build the launcher only
#
# Settings (environment):
#   NEO4J_INSTANCES   DBMS instances in the one server process (default 1; each
#                     has its own port and database: Community has one user
#                     database per DBMS, so parallel tests lease an instance each)
#   NEO4J_PARENT_PID  the server stops when this process ends, however it ends
#                     (default: the caller of this script)
#   NEO4J_HEAP        the JVM's -Xmx (default 1g)
#   NEO4J_TX_MEMORY   db.memory.transaction.max in bytes (default 0: unbounded)
#   NEO4J_START_TIMEOUT seconds to wait for Bolt (default 180)
#   NEO4J_REMOVE_DIR  when set, the server deletes DIR once it has stopped
#   NEO4J_BOLT_TLS    1 (default): Bolt offers TLS as well as plain text on
#                     each instance's port (bolt+s:// and bolt://), with a CA
#                     made for this server in DIR/bolt-tls; start prints its
#                     path as CONVERGE_NEO4J_CA. 0: plain Bolt alone. The
#                     certificates are made by `go run ./internal/testenv/testcerts`,
#                     so TLS needs Go on PATH.
#
# Java 17 and Maven are installed from Debian when missing and running as
# root (as ensure-postgres.sh does for PostgreSQL). Maven keeps its local
# repository under the user's home, so a second build downloads nothing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
project=$root/test/neo4j
classpath="$project/target/classes:$project/target/lib/*"

die() { echo "neo4j-server: $*" >&2; exit 1; }

ensure_tools() {
	local missing=()
	command -v java >/dev/null 2>&1 || missing+=(java)
	command -v javac >/dev/null 2>&1 || missing+=(javac)
	command -v mvn >/dev/null 2>&1 || missing+=(mvn)
	((${#missing[@]} == 0)) && return 0
	if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		die "no ${missing[*]} on PATH (Java 17 and Maven are needed): install them, e.g. apt-get install openjdk-17-jdk-headless maven"
	fi
	echo "neo4j-server: no ${missing[*]} on PATH; installing openjdk-17-jdk-headless and maven with apt-get..." >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
}

build() {
	ensure_tools
	local stamp=$project/target/.built
	if [[ -f $stamp && $stamp -nt $project/pom.xml ]] &&
		[[ -z $(find "$project/src" -newer "$stamp" -type f -print -quit) ]]; then
		return 0
	fi
	echo "neo4j-server: building the launcher (first run downloads Neo4j from Maven Central)..." >&2
	local start=$SECONDS
	local log
	log=$(mktemp)
	if ! mvn -q -B -Dstyle.color=never -f "$project/pom.xml" package >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		die "maven build of $project failed"
	fi
	rm -f "$log"
	touch "$stamp"
	echo "neo4j-server: built in $((SECONDS - start)) s" >&2
}

start() {
	local dir=$1
	build
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [[ -f $dir/server.pid ]] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null; then
		die "a server already runs from $dir (pid $(cat "$dir/server.pid")); stop it first"
	fi
	rm -f "$dir/server.env"
	local password
	password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
	local parent=${NEO4J_PARENT_PID:-$PPID}
	local begin=$SECONDS
	# A CA of this server's own, made anew at each start: its clients trust
	# it alone, and nothing else is signed with it (its key is never
	# written). Go's build cache keeps the program, so this costs about
	# a second after the first time.
	local tls_args=() ca=
	if [[ ${NEO4J_BOLT_TLS:-1} == 1 ]]; then
		command -v go >/dev/null 2>&1 || die "no go on PATH to make the Bolt TLS certificates (or set NEO4J_BOLT_TLS=0)"
		rm -rf "$dir/bolt-tls"
		ca=$(cd "$root" && go run ./internal/testenv/testcerts "$dir/bolt-tls") ||
			die "making the Bolt TLS certificates in $dir/bolt-tls failed"
		tls_args=(--bolt-tls "$dir/bolt-tls")
	fi
	# setsid: the server has its own process group, so a terminal's Ctrl-C
	# reaches it only through the parent watch and this script's trap.
	setsid java -Xmx"${NEO4J_HEAP:-1g}" -XX:+UseSerialGC -cp "$classpath" converge.neo4j.Server \
		--dir "$dir" --password "$password" --instances "${NEO4J_INSTANCES:-1}" \
		--parent-pid "$parent" --tx-memory "${NEO4J_TX_MEMORY:-0}" ${NEO4J_REMOVE_DIR:+--remove-dir} "${tls_args[@]}" \
		>"$dir/server.out" 2>"$dir/server.log" </dev/null &
	local pid=$!
	echo "$pid" >"$dir/server.pid"
	local deadline=$((SECONDS + ${NEO4J_START_TIMEOUT:-180}))
	until [[ -s $dir/server.env ]]; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 40 "$dir/server.log" >&2 || true
			die "the server exited before answering (log: $dir/server.log)"
		fi
		if ((SECONDS > deadline)); then
			kill -TERM "$pid" 2>/dev/null || true
			die "no answer within ${NEO4J_START_TIMEOUT:-180} s (log: $dir/server.log)"
		fi
		sleep 0.2
	done
	# Bolt answers: open a TCP connection to every instance.
	local url
	for url in $(sed -n 's/^CONVERGE_NEO4J_URLS=//p' "$dir/server.env" | tr ',' ' '); do
		local hostport=${url#bolt://}
		(exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}") 2>/dev/null || die "Bolt at $url does not answer"
	done
	echo "neo4j-server: $(sed -n 's/^CONVERGE_NEO4J_URLS=//p' "$dir/server.env") ready in $((SECONDS - begin)) s (pid $pid, files in $dir${ca:+, Bolt TLS CA $ca})" >&2
	cat "$dir/server.env"
	[[ -z $ca ]] || echo "CONVERGE_NEO4J_CA=$ca"
}

stop() {
	local dir=$1
	[[ -f $dir/server.pid ]] || return 0
	local pid
	pid=$(cat "$dir/server.pid")
	if kill -TERM "$pid" 2>/dev/null; then
		local i
		for ((i = 0; i < 300; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "neo4j-server: pid $pid still running after 30 s; killing it" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$dir/server.pid" "$dir/server.env"
}

case ${1:-} in
build) build ;;
start)
	[[ $# -eq 2 ]] || die "usage: $0 start DIR"
	start "$2"
	;;
stop)
	[[ $# -eq 2 ]] || die "usage: $0 stop DIR"
	stop "$2"
	;;
run)
	shift
	services=
	[[ ${1:-} == --services ]] && { services=1; shift; }
	[[ ${1:-} == -- ]] && shift
	[[ $# -gt 0 ]] || die "usage: $0 run -- COMMAND [ARGS...]"
	if [[ -z $services && ${CI:-} != true ]] && ! (build) 2>/tmp/converge-neo4j-build.$$; then
		# Without Java or Maven (and not root to install them) the tests
		# run without Neo4j: each of its tests says so and skips. CI=true
		# never gets here, so a CI run cannot pass without Neo4j.
		echo "neo4j-server: ########################################################" >&2
		echo "neo4j-server: NO NEO4J SERVER: $(tail -n 1 /tmp/converge-neo4j-build.$$)" >&2
		echo "neo4j-server: the tests that need Neo4j will SKIP" >&2
		echo "neo4j-server: ########################################################" >&2
		rm -f /tmp/converge-neo4j-build.$$
		exec "$@"
	fi
	rm -f /tmp/converge-neo4j-build.$$
	dir=$(mktemp -d "${TMPDIR:-/tmp}/converge-neo4j.XXXXXX")
	trap 'stop "$dir"; rm -rf "$dir"' EXIT
	trap 'exit 130' INT TERM
	NEO4J_PARENT_PID=$$ start "$dir" >"$dir/start.out"
	get() { sed -n "s/^$1=//p" "$dir/start.out"; }
	if [[ -n $services ]]; then
		CONVERGE_NEO4J_URL=$(get CONVERGE_NEO4J_URL) CONVERGE_NEO4J_USER=$(get CONVERGE_NEO4J_USER) \
			CONVERGE_NEO4J_PASSWORD=$(get CONVERGE_NEO4J_PASSWORD)
		export CONVERGE_NEO4J_URL CONVERGE_NEO4J_USER CONVERGE_NEO4J_PASSWORD
		status=0
		"$@" || status=$?
		exit "$status"
	fi
	# The tests' names only: CONVERGE_NEO4J_* would switch the services that
	# CMD starts to Neo4j, changing what their tests mean.
	CONVERGE_TEST_NEO4J_URLS=$(get CONVERGE_NEO4J_URLS) CONVERGE_TEST_NEO4J_URL=$(get CONVERGE_NEO4J_URL) \
		CONVERGE_TEST_NEO4J_USER=$(get CONVERGE_NEO4J_USER) CONVERGE_TEST_NEO4J_PASSWORD=$(get CONVERGE_NEO4J_PASSWORD) \
		CONVERGE_TEST_NEO4J_CA=$(get CONVERGE_NEO4J_CA)
	export CONVERGE_TEST_NEO4J_URLS CONVERGE_TEST_NEO4J_URL CONVERGE_TEST_NEO4J_USER CONVERGE_TEST_NEO4J_PASSWORD \
		CONVERGE_TEST_NEO4J_CA
	export CONVERGE_TEST_NEO4J_DIR=$dir
	status=0
	"$@" || status=$?
	exit "$status"
	;;
*) die "usage: $0 start DIR | stop DIR | run [--services] -- COMMAND | build" ;;
esac
