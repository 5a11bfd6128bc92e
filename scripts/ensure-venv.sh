#!/usr/bin/env bash
# Usage: ensure-venv.sh NAME
#
# Installs test/NAME/requirements.txt (from PyPI) into a virtual environment
# at bin/NAME when it is missing or its requirements changed, and prints the
# path of the environment's bin directory. NAME is schemathesis (make
# fuzz-api) or embedserver (the local embedding server of make test-embed).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: ensure-venv.sh NAME}
req=test/$name/requirements.txt
if [ ! -f "$req" ]; then
	echo "ensure-venv: $req does not exist" >&2
	exit 1
fi
venv=bin/$name
stamp=$venv/.requirements
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then
	echo "$PWD/$venv/bin"
	exit 0
fi
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
	echo "ensure-venv: $name needs Python 3.10 or newer ($python)" >&2
	exit 1
fi
echo "ensure-venv: installing $(grep -v '^#' "$req" | xargs) into $venv" >&2
start=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
cp "$req" "$stamp"
echo "ensure-venv: $venv installed in $(($(date +%s) - start)) s, $(du -sm "$venv" | cut -f1) MB" >&2
echo "$PWD/$venv/bin"
