#!/usr/bin/env bash
# Ensures a headless Chromium for the console's browser test
# (internal/console), installing Debian's chromium with apt-get when running
# as root. Idempotent and silent when it is already present; prints the
# browser's path on success.
#
# Lookup order matches the test: $CONVERGE_CHROMIUM, /usr/bin/chromium,
# chromium or chromium-browser on $PATH.
set -euo pipefail

find_chromium() {
	if [[ -n ${CONVERGE_CHROMIUM:-} ]]; then
		[[ -x $CONVERGE_CHROMIUM ]] && { echo "$CONVERGE_CHROMIUM"; return 0; }
		return 1
	fi
	[[ -x /usr/bin/chromium ]] && { echo /usr/bin/chromium; return 0; }
	local name
	for name in chromium chromium-browser; do
		command -v "$name" 2>/dev/null && return 0
	done
	return 1
}

if find_chromium; then
	exit 0
fi

if [[ -n ${CONVERGE_CHROMIUM:-} ]]; then
	echo "ensure-chromium: CONVERGE_CHROMIUM=$CONVERGE_CHROMIUM is not an executable" >&2
	exit 1
fi

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-chromium: chromium not found (looked at /usr/bin/chromium and on \$PATH)." >&2
	echo "ensure-chromium: install Debian's chromium (e.g. sudo apt-get install chromium) or set CONVERGE_CHROMIUM to a Chromium binary." >&2
	exit 1
fi

echo "ensure-chromium: installing chromium with apt-get..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null

if ! find_chromium; then
	echo "ensure-chromium: chromium installed but /usr/bin/chromium still not found" >&2
	exit 1
fi
