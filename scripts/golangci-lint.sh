#!/usr/bin/env bash
# Runs golangci-lint at the version the project pins, installing it first:
# scripts/golangci-lint.sh [ARGS...] (default: run ./...).
#
# The binary is built from the Go module proxy with `go install` into
# bin/golangci-lint-<version>/ (git ignores bin/), once; later runs find it
# there. A golangci-lint on PATH is not used: another version reports other
# findings.
set -euo pipefail
cd "$(dirname "$0")/.."

version=2.15.0
dir="bin/golangci-lint-$version"
lint="$dir/golangci-lint"

if [ ! -x "$lint" ] || ! "$lint" version 2>/dev/null | grep -q "version $version "; then
	echo "installing golangci-lint $version into $dir" >&2
	start=$(date +%s)
	mkdir -p "$dir"
	GOBIN="$PWD/$dir" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v$version"
	echo "installed golangci-lint $version in $(($(date +%s) - start)) s" >&2
fi
if [ $# -eq 0 ]; then
	set -- run ./...
fi
exec "$lint" "$@"
