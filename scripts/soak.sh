#!/bin/sh
# Soak run: start the exporter on a config (default: the quickstart, an
# in-process emulated engine) and sample its own /metrics every INTERVAL
# seconds for DURATION seconds. Prints one tab-separated row per sample:
# elapsed seconds, heap in use, resident memory, goroutines, open files,
# finished requests by outcome (success / all), dropped requests.
#
#   scripts/soak.sh [CONFIG] > soak.tsv      DURATION=1800 INTERVAL=60 by default
set -eu
config=${1:-examples/quickstart.yml}
duration=${DURATION:-1800}
interval=${INTERVAL:-60}
addr=${ADDR:-127.0.0.1:9819}
bin=${BIN:-./bin/kvload-exporter}

[ -x "$bin" ] || go build -o "$bin" ./cmd/kvload-exporter
"$bin" --config.file="$config" --web.listen-address="$addr" --log.level=warn 2>soak.stderr.log &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT INT TERM

metric() { # sum of the samples of one metric name (optionally filtered by a label matcher)
	awk -v name="$1" -v want="${2:-}" '
		$1 ~ "^"name"([{]|$)" && index($1, want) { s += $NF }
		END { printf "%.0f", s }' "$3"
}

printf 'elapsed_s\theap_inuse_bytes\trss_bytes\tgoroutines\topen_fds\tsuccess\tfinished\tdropped\n'
start=$(date +%s)
sleep 2
while :; do
	now=$(date +%s)
	elapsed=$((now - start))
	m=$(mktemp)
	if curl -fsS "http://$addr/metrics" >"$m"; then
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$elapsed" \
			"$(metric go_memstats_heap_inuse_bytes '' "$m")" \
			"$(metric process_resident_memory_bytes '' "$m")" \
			"$(metric go_goroutines '' "$m")" \
			"$(metric process_open_fds '' "$m")" \
			"$(metric kvload_requests_total 'outcome="success"' "$m")" \
			"$(metric kvload_requests_total '' "$m")" \
			"$(metric kvload_requests_dropped_total '' "$m")"
	else
		printf '%s\tscrape failed\n' "$elapsed"
	fi
	rm -f "$m"
	[ "$elapsed" -ge "$duration" ] && break
	sleep "$interval"
done
