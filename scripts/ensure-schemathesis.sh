#!/usr/bin/env bash
# Installs Schemathesis (test/schemathesis/requirements.txt, from PyPI) into
# a virtual environment at bin/schemathesis when it is missing or its
# requirements changed, and prints the path of its executable.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=bin/schemathesis
req=test/schemathesis/requirements.txt
stamp=$venv/.requirements
if [ -x "$venv/bin/schemathesis" ] && cmp -s "$req" "$stamp"; then
	echo "$PWD/$venv/bin/schemathesis"
	exit 0
fi
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
	echo "ensure-schemathesis: Schemathesis needs Python 3.10 or newer ($python)" >&2
	exit 1
fi
echo "ensure-schemathesis: installing $(grep -v '^#' "$req" | xargs) into $venv" >&2
rm -rf "$venv"
"$python" -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
cp "$req" "$stamp"
echo "$PWD/$venv/bin/schemathesis"
