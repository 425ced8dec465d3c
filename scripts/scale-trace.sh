#!/bin/sh
# scale-trace.sh: write a big Mooncake trace for the scale benchmarks by
# repeating the shared conversation trace: each copy's timestamps start
# where the previous copy's pass would have ended, and its hash ids are
# moved past every id of the copies before, so no copy shares a block with
# another (as a longer recording of different traffic would).
#
# usage: scale-trace.sh SOURCE.jsonl ROWS > OUT.jsonl
set -eu
src=${1:?usage: scale-trace.sh SOURCE.jsonl ROWS}
rows=${2:?usage: scale-trace.sh SOURCE.jsonl ROWS}

# One pass over the source for the id and time spans of a copy.
span=$(awk '
	match($0, /"timestamp": *[0-9.]+/) { t = substr($0, RSTART, RLENGTH); sub(/.*: */, "", t); if (t + 0 > maxt) maxt = t + 0; n++ }
	match($0, /"hash_ids": *\[[^]]*\]/) {
		s = substr($0, RSTART, RLENGTH); sub(/.*\[/, "", s); sub(/\]/, "", s)
		k = split(s, ids, /, */); for (i = 1; i <= k; i++) if (ids[i] + 0 > maxid) maxid = ids[i] + 0
	}
	END { if (n < 2) exit 1; printf "%d %d\n", maxt + maxt / (n - 1), maxid + 1 }' "$src")
set -- $span
tspan=$1 idspan=$2

awk -v rows="$rows" -v tspan="$tspan" -v idspan="$idspan" -v src="$src" '
BEGIN {
	for (copy = 0; out < rows; copy++) {
		while (out < rows && (getline line < src) > 0) {
			if (copy > 0) {
				if (match(line, /"timestamp": *[0-9.]+/)) {
					t = substr(line, RSTART, RLENGTH); sub(/.*: */, "", t)
					line = substr(line, 1, RSTART - 1) "\"timestamp\": " sprintf("%d", t + copy * tspan) substr(line, RSTART + RLENGTH)
				}
				if (match(line, /"hash_ids": *\[[^]]*\]/)) {
					s = substr(line, RSTART, RLENGTH); sub(/.*\[/, "", s); sub(/\]/, "", s)
					k = split(s, ids, /, */); s = ""
					for (i = 1; i <= k; i++) s = s (i > 1 ? ", " : "") sprintf("%d", ids[i] + copy * idspan)
					line = substr(line, 1, RSTART - 1) "\"hash_ids\": [" s "]" substr(line, RSTART + RLENGTH)
				}
			}
			print line
			out++
		}
		close(src)
	}
}'
