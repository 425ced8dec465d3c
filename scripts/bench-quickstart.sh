#!/bin/sh
# Quickstart memory benchmark: run the quickstart (examples/quickstart.yml:
# a bundled trace against an emulated engine in the same process) for
# DURATION seconds, sample its resident memory every INTERVAL seconds, and
# print the samples, then the peak (the kernel's VmHWM, exact between
# samples), the final RSS and the requests it answered. Exits 1 when the
# peak is above LIMIT_MIB, or when the exporter stops early.
#
#   make bench-quickstart                          DURATION=600 INTERVAL=5 LIMIT_MIB=250
#   DURATION=180 scripts/bench-quickstart.sh       a shorter run while iterating
set -eu
config=${CONFIG:-examples/quickstart.yml}
duration=${DURATION:-600}
interval=${INTERVAL:-5}
limit=${LIMIT_MIB:-250}
addr=${ADDR:-127.0.0.1:9817}
bin=${BIN:-./bin/kvload-exporter}
log=${LOG:-${TMPDIR:-/tmp}/bench-quickstart.log}

[ -x "$bin" ] || go build -o "$bin" ./cmd/kvload-exporter
"$bin" --config.file="$config" --web.listen-address="$addr" --log.level=warn 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT INT TERM

kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$pid/status" 2>/dev/null; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

printf 'elapsed_s\trss_mib\n'
start=$(date +%s)
rss=0
while :; do
	sleep "$interval"
	now=$(date +%s)
	rss=$(kib VmRSS)
	if [ -z "$rss" ]; then
		echo "the exporter stopped after $((now - start)) s; see $log" >&2
		exit 1
	fi
	printf '%s\t%s\n' "$((now - start))" "$(mib "$rss")"
	[ $((now - start)) -ge "$duration" ] && break
done

peak=$(kib VmHWM)
ok=$(curl -fsS "http://$addr/metrics" | awk '$1 ~ /^kvload_requests_total[{]/ && $1 ~ /outcome="success"/ { s += $NF } END { printf "%.0f", s }')
printf 'peak RSS %s MiB (limit %s), final RSS %s MiB, %s requests succeeded in %s s\n' \
	"$(mib "$peak")" "$limit" "$(mib "$rss")" "$ok" "$duration"
[ "$peak" -le $((limit * 1024)) ] || { echo "peak RSS above $limit MiB" >&2; exit 1; }
