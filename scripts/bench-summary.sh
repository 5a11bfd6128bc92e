#!/usr/bin/env bash
# bench-summary.sh FILE: the summary table of a make bench output. Every
# benchmark that measures a target logs one row a run,
# "SUMMARY|target|figure|limit|ratio|goal|MET or MISSED"
# (internal/benchsummary); this prints one Markdown row a target: the run
# with the median ratio, and how many runs there were.
set -euo pipefail
file=${1:?usage: bench-summary.sh FILE}
rows=$(grep -o 'SUMMARY|.*' "$file" | sed 's/^SUMMARY|//' || true)
if [ -z "$rows" ]; then
	echo "bench-summary: no summary rows in $file" >&2
	exit 1
fi
echo
echo "| target | figure | limit | ratio | goal | verdict | runs |"
echo "|---|---|---|---|---|---|---|"
# Sorted by target, then ratio; for each target the middle row.
printf '%s\n' "$rows" | sort -t'|' -k1,1 -k4,4g | awk -F'|' '
	function flush() {
		if (n == 0) return
		m = int((n + 1) / 2)
		split(row[m], f, "|")
		printf "| %s | %s | %s | %.2f | %s | %s | %d |\n", f[1], f[2], f[3], f[4], f[5], f[6], n
		n = 0
	}
	$1 != last { flush(); last = $1 }
	{ row[++n] = $0 }
	END { flush() }'
