// Command benchrate runs kvload-exporter and vegeta, one after the other,
// at the same constant request rates against the same local sink (a
// separate process streaming OpenAI chat responses, 32 tokens unless
// -tokens says otherwise), and prints
// for each the achieved rate, the send lag percentiles and the CPU time
// per 1,000 requests of the load tool and of the sink, over -rounds paired
// runs a rate, then the medians of the pairs side by side (make bench-rate;
// docs/benchmarks.md holds the figures).
//
//	benchrate -exporter bin/kvload-exporter -vegeta bin/vegeta -rates 1000,5000 -duration 10s -rounds 25
//	benchrate sink [-addr ADDR] [-tokens N] [-events-per-write N]   (the sink alone; benchrate starts it itself)
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sink" {
		if err := runSink(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.exporter, "exporter", "bin/kvload-exporter", "kvload-exporter binary")
	flag.StringVar(&o.vegeta, "vegeta", "bin/vegeta", "vegeta binary")
	flag.StringVar(&o.rates, "rates", "1000,5000", "requests/s, comma-separated")
	flag.DurationVar(&o.dur, "duration", 10*time.Second, "length of each run")
	flag.StringVar(&o.only, "only", "", "run only this tool: kvload or vegeta")
	flag.IntVar(&o.rounds, "rounds", 25, "paired runs of the two tools at each rate, in alternating order; the summary compares them by their medians and bounds the CPU ratio's median (5 or more)")
	flag.IntVar(&o.storm, "storm", 100, "concurrent /metrics scrapers of the extra kvload run at -storm-rate; 0 for none")
	flag.IntVar(&o.stormRate, "storm-rate", 1000, "requests/s of the kvload run under a scrape storm")
	flag.DurationVar(&o.stormGap, "storm-interval", 100*time.Millisecond, "pause of each scraper between scrapes; 0 for back to back")
	flag.BoolVar(&o.stormControl, "storm-control", true, "after the storm, the same storm on a copy of the exporter's /metrics served by another process (the machine's share of the lag)")
	flag.IntVar(&o.stream.tokens, "tokens", 32, "output tokens of every streamed response")
	flag.IntVar(&o.stream.perWrite, "sink-events-per-write", 1, "SSE events the sink writes and flushes at once: 1 like a real engine, 35 for the whole 32-token stream in one write (a sink cheaper than its client)")
	flag.StringVar(&keepArrivals, "keep-arrivals", "", "directory to write each run's arrival logs to (JSON arrays of Unix nanoseconds, TOOL-RATE-TIME-received.json and -handled.json)")
	flag.StringVar(&o.onSaturation, "on-saturation", "queue", "the exporter's on_saturation when max_in_flight (4,096) requests are out: queue sends the row late, as vegeta does; drop skips and counts it")
	flag.StringVar(&o.exporterEnv, "exporter-env", "", "extra environment of the exporter only, comma-separated KEY=VALUE (e.g. GOGC=400)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchrate:", err)
		os.Exit(1)
	}
}

// options are benchrate's flags.
type options struct {
	exporter, vegeta string
	rates, only      string
	rounds           int
	dur              time.Duration
	storm, stormRate int
	stormGap         time.Duration
	stormControl     bool
	stream           streamShape
	exporterEnv      string
	onSaturation     string // the exporter's workloads[].on_saturation
}

// outcome is one tool's run at one rate.
type outcome struct {
	tool     string
	rate     int
	sent     int64         // requests the sink received
	achieved float64       // requests/s the sink received, as arrivalRate fits them
	p50, p99 time.Duration // the tool's own send lag (see lagSource)
	// The send lag as the sink's socket saw it (the kernel's receive
	// stamps, wire.go), by one formula for both tools (arrivalLag): what
	// the comparison with vegeta uses.
	sinkP50, sinkP99 time.Duration
	// The same at the sink's handler, which its own scheduling delays.
	handlerP50, handlerP99 time.Duration
	unstamped              int64 // requests with no receive stamp, timed at the handler instead
	// dropped is the requests the run asked for that never went out: the
	// rows the exporter dropped, or what vegeta had not sent when its
	// -duration ended (it stops there, late or not).
	dropped float64
	toolCPU float64 // CPU-seconds of the load tool over the run
	toolSys float64 // the part of toolCPU spent in the kernel
	sinkCPU float64 // CPU-seconds of the sink over the run
	// machineBusy is the share of all the machine's CPU time that the
	// tool and the sink used together over the run: near 1, the kernel's
	// run queue sets the tail of the lag, whichever tool is measured.
	machineBusy float64
	lagSource   string
	scrapes     map[int]int // status code → scrapes, under a storm
	// The exporter's heap allocations over the run (its Go runtime's
	// counters, which the machine's load does not change), and its
	// garbage collections.
	mallocs, allocBytes, gcs float64
	// The exporter's /metrics as a storm's scrapers received it (gzip),
	// at the end of a storm run, for the control run.
	metrics *capturedResponse
}

// capturedResponse is one answer of /metrics, as sent.
type capturedResponse struct {
	header http.Header
	body   []byte
}

func (c *capturedResponse) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	for k, v := range c.header {
		w.Header()[k] = v
	}
	_, _ = w.Write(c.body)
}

func run(opt options) error {
	// Every flag is checked before anything starts.
	if err := opt.stream.check(); err != nil {
		return err
	}
	if opt.rounds < 1 {
		return fmt.Errorf("-rounds %d: want at least 1", opt.rounds)
	}
	if opt.onSaturation != "queue" && opt.onSaturation != "drop" {
		// The exporter would refuse its configuration, and the run would
		// wait 30 s for a readiness that never comes.
		return fmt.Errorf("-on-saturation %q: want queue or drop", opt.onSaturation)
	}
	var rates []int
	for _, f := range strings.Split(opt.rates, ",") {
		rate, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || rate <= 0 {
			return fmt.Errorf("rate %q: want a positive integer", f)
		}
		rates = append(rates, rate)
	}
	if err := checkRunSize(rates, opt); err != nil {
		return err
	}
	exp := exporterCmd{bin: opt.exporter}
	for _, kv := range strings.Split(opt.exporterEnv, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("-exporter-env %q: want KEY=VALUE", kv)
		}
		exp.env = append(exp.env, kv)
	}
	only, storm := opt.only, opt.storm
	for _, bin := range []string{opt.exporter, opt.vegeta} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%w (make bench-rate builds it)", err)
		}
	}
	dir, err := os.MkdirTemp("", "benchrate")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	sinkCmd := exec.CommandContext(ctx, self, append([]string{"sink"}, opt.stream.args()...)...)
	sinkCmd.Stderr = os.Stderr
	out, err := sinkCmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := sinkCmd.Start(); err != nil {
		return fmt.Errorf("start sink: %w", err)
	}
	defer func() {
		_ = sinkCmd.Process.Signal(syscall.SIGTERM)
		_ = sinkCmd.Wait()
	}()
	line := make([]byte, 64)
	n, err := out.Read(line)
	if err != nil {
		return fmt.Errorf("sink address: %w", err)
	}
	sinkAddr := strings.TrimSpace(string(line[:n]))
	sinkURL := "http://" + sinkAddr

	su := setup{exp: exp, vegeta: opt.vegeta, dir: dir, sinkURL: sinkURL, sinkPid: sinkCmd.Process.Pid, dur: opt.dur, tokens: opt.stream.tokens, onSaturation: opt.onSaturation}
	fmt.Printf("machine: %d CPUs, %s; load average %s\n", runtime.NumCPU(), cpuModel(), loadAvg())
	fmt.Printf("sink %s (pid %d), %d-token streams, %d SSE events per write, %v per run; exporter environment %v\n\n", sinkURL, sinkCmd.Process.Pid, opt.stream.tokens, opt.stream.perWrite, opt.dur, exp.env)
	var results []outcome
	var summaries []rateSummary
	for _, rate := range rates {
		var pairs []pairedRound
		for round := range opt.rounds {
			var p pairedRound
			// Alternating which tool goes first cancels a machine that
			// drifts over the rounds.
			order := []string{"kvload", "vegeta"}
			if round%2 == 1 {
				order = []string{"vegeta", "kvload"}
			}
			for _, tool := range order {
				if only != "" && only != tool {
					continue
				}
				var o outcome
				var err error
				if tool == "kvload" {
					o, err = runKvload(ctx, su, rate, 0, 0, "")
					p.kvload = &o
				} else {
					o, err = runVegeta(ctx, su, rate)
					p.vegeta = &o
				}
				if err != nil {
					return err
				}
				results = append(results, o)
				printOutcome(o)
			}
			pairs = append(pairs, p)
		}
		if only == "" {
			summaries = append(summaries, summarize(rate, pairs))
		}
	}
	if storm > 0 && (only == "" || only == "kvload") {
		o, err := runKvload(ctx, su, opt.stormRate, storm, opt.stormGap, "")
		if err != nil {
			return err
		}
		results = append(results, o)
		printOutcome(o)
		fmt.Printf("scrapes by status: %v\n", o.scrapes)
		if opt.stormControl && o.metrics != nil {
			// The control: the same storm, on the same machine, served
			// by another process with the exporter's own bytes. What it
			// moves is the machine's share; the rest is the exporter's.
			copySrv := httptest.NewServer(o.metrics)
			c, err := runKvload(ctx, su, opt.stormRate, storm, opt.stormGap, copySrv.URL+"/metrics")
			copySrv.Close()
			if err != nil {
				return err
			}
			results = append(results, c)
			printOutcome(c)
			fmt.Printf("scrapes of the copy by status: %v\n", c.scrapes)
		}
	}
	fmt.Printf("\nload average after: %s\n\n", loadAvg())
	fmt.Println("| tool | target req/s | achieved req/s | requests | dropped | p50 lag at the sink | p99 lag at the sink | p99 lag at the sink's handler | p50 own send lag | p99 own send lag | tool CPU-s per 1,000 req | sink CPU-s per 1,000 req | sink and tool, share of the machine |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, o := range results {
		fmt.Printf("| %s | %d | %.0f | %d | %.0f | %s | %s | %s | %s | %s | %.3f | %.3f | %.0f %% |\n", o.tool, o.rate, o.achieved, o.sent, o.dropped,
			ms(o.sinkP50), ms(o.sinkP99), ms(o.handlerP99), ms(o.p50), ms(o.p99), perK(o.toolCPU, o.sent), perK(o.sinkCPU, o.sent), 100*o.machineBusy)
	}
	if len(summaries) > 0 {
		fmt.Printf("\nkvload-exporter against vegeta, %d paired rounds a rate (median, then the range):\n\n", opt.rounds)
		fmt.Printf("| req/s | CPU per request, kvload over vegeta | its median's %.0f %% upper bound | kvload p99 lag at the sink | vegeta p99 lag at the sink | own p99 lag, kvload / vegeta (medians) | achieved req/s, kvload / vegeta | dropped or never sent, kvload / vegeta | sink and tool, share of the machine, kvload / vegeta runs | at or under vegeta |\n", 100*boundConfidence)
		fmt.Println("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
		for _, m := range summaries {
			fmt.Println(m.row())
		}
		for _, m := range summaries {
			if note := m.boundNote(); note != "" {
				fmt.Println("\n" + note)
			}
		}
		for _, m := range summaries {
			if note := m.machineNote(); note != "" {
				fmt.Println("\n" + note)
			}
		}
	}
	return nil
}

func printOutcome(o outcome) {
	fmt.Printf("%-6s %5d/s: achieved %.0f/s, %d requests, %.0f dropped, lag at the sink p50 %s p99 %s (at its handler p50 %s p99 %s), own lag p50 %s p99 %s (%s), CPU %.2f s of which %.2f s in the kernel (%.3f per 1,000 req), sink CPU %.2f s, %.0f %% of the machine's CPU time for both\n",
		o.tool, o.rate, o.achieved, o.sent, o.dropped, ms(o.sinkP50), ms(o.sinkP99), ms(o.handlerP50), ms(o.handlerP99), ms(o.p50), ms(o.p99), o.lagSource, o.toolCPU, o.toolSys, perK(o.toolCPU, o.sent), o.sinkCPU, 100*o.machineBusy)
	if o.unstamped > 0 {
		fmt.Printf("%-6s %5d/s: %d requests came without the kernel's receive stamp; the sink's handler timed them\n", o.tool, o.rate, o.unstamped)
	}
	if o.sent > 0 && o.mallocs > 0 {
		n := float64(o.sent)
		fmt.Printf("%-6s %5d/s: %.0f heap allocations and %.0f bytes per request, %.0f garbage collections\n", o.tool, o.rate, o.mallocs/n, o.allocBytes/n, o.gcs)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

func perK(cpu float64, n int64) float64 {
	if n == 0 {
		return math.NaN()
	}
	return cpu / float64(n) * 1000
}

// exporterCmd is the exporter binary and what its environment adds.
type exporterCmd struct {
	bin string
	env []string
}

// setup is what every run shares: the tools, the sink and the load's shape.
type setup struct {
	exp     exporterCmd
	vegeta  string
	dir     string // scratch files
	sinkURL string
	sinkPid int
	dur     time.Duration
	tokens  int // output tokens of every stream
	// onSaturation is the exporter's on_saturation: queue, as vegeta
	// never skips a request, or drop.
	onSaturation string
}

// runKvload replays a trace of rate×dur evenly spaced rows (64-token
// prompts, su.tokens output tokens) once, and reads its own lag histogram. With
// storm > 0, that many scrapers fetch /metrics meanwhile, each pausing
// stormGap between scrapes: the exporter's, or stormURL's when set.
func runKvload(ctx context.Context, su setup, rate, storm int, stormGap time.Duration, stormURL string) (outcome, error) {
	exp, dir, sinkURL, sinkPid, dur := su.exp, su.dir, su.sinkURL, su.sinkPid, su.dur
	o := outcome{tool: "kvload", rate: rate, lagSource: "kvload_schedule_lag_seconds, classic buckets, interpolated"}
	switch {
	case storm > 0 && stormURL != "":
		o.tool = fmt.Sprintf("kvload, %d scrapers every %v of a copy of its /metrics served by another process", storm, stormGap)
	case storm > 0:
		o.tool = fmt.Sprintf("kvload, %d scrapers every %v", storm, stormGap)
	}
	rows := int(float64(rate) * dur.Seconds())
	trace := filepath.Join(dir, fmt.Sprintf("rate%d.jsonl", rate))
	var b bytes.Buffer
	for i := range rows {
		fmt.Fprintf(&b, `{"timestamp": %.4f, "input_length": 64, "output_length": %d, "hash_ids": [%d]}`+"\n", float64(i)*1000/float64(rate), su.tokens, i)
	}
	if err := os.WriteFile(trace, b.Bytes(), 0o644); err != nil {
		return o, err
	}
	cfg := filepath.Join(dir, fmt.Sprintf("rate%d.yml", rate))
	yml := fmt.Sprintf(`targets:
  - name: sink
    url: %s
    model: bench
    dialect: openai
    cache: {block_size: 16, capacity_blocks: 0, observed: none}
workloads:
  - name: rate
    trace: %s
    targets: [sink]
    seed: 1
    loop: once
    max_in_flight: 4096
    on_saturation: %s
`, sinkURL, trace, su.onSaturation)
	if err := os.WriteFile(cfg, []byte(yml), 0o644); err != nil {
		return o, err
	}
	web, err := freeAddr()
	if err != nil {
		return o, err
	}
	if err := resetSink(sinkURL); err != nil {
		return o, err
	}
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("kvload%d.log", rate)))
	if err != nil {
		return o, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, exp.bin, "--config.file="+cfg, "--web.listen-address="+web, "--shutdown.drain-timeout=5s")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), exp.env...)
	if err := cmd.Start(); err != nil {
		return o, fmt.Errorf("start kvload-exporter: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	// CPU is counted from readiness: what the exporter spends before
	// (configuration, trace, tokenizer) is start-up, not load.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if resp, err := http.Get("http://" + web + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return o, fmt.Errorf("kvload-exporter not ready after 30 s (log: %s)", logf.Name())
		}
	}
	cpu0, sink0, sys0 := procCPU(pid), procCPU(sinkPid), procSys(pid)
	start := time.Now()
	before, err := get("http://" + web + "/metrics")
	if err != nil {
		return o, err
	}
	if stormURL == "" {
		stormURL = "http://" + web + "/metrics"
	}
	stopStorm := scrapeStorm(ctx, stormURL, storm, stormGap)
	st, err := waitSink(sinkURL, int64(rows), dur)
	o.scrapes = stopStorm()
	if err != nil {
		return o, err
	}
	if storm > 0 {
		if o.metrics, err = captureGzip("http://" + web + "/metrics"); err != nil {
			return o, err
		}
	}
	time.Sleep(100 * time.Millisecond) // the last streams end
	cpu1, sink1, sys1 := procCPU(pid), procCPU(sinkPid), procSys(pid)
	wall := time.Since(start)
	text, err := get("http://" + web + "/metrics")
	if err != nil {
		return o, err
	}
	o.sent, o.unstamped = st.Requests, st.Unstamped
	if err := o.judgeAtSink(sinkURL); err != nil {
		return o, err
	}
	o.toolCPU, o.sinkCPU, o.toolSys = cpu1-cpu0, sink1-sink0, sys1-sys0
	o.machineBusy = machineShare(o.toolCPU+o.sinkCPU, runtime.NumCPU(), wall)
	o.dropped = sumSeries(text, "kvload_requests_dropped_total")
	o.mallocs = sumSeries(text, "go_memstats_mallocs_total") - sumSeries(before, "go_memstats_mallocs_total")
	o.allocBytes = sumSeries(text, "go_memstats_alloc_bytes_total") - sumSeries(before, "go_memstats_alloc_bytes_total")
	o.gcs = sumSeries(text, "go_gc_duration_seconds_count") - sumSeries(before, "go_gc_duration_seconds_count")
	buckets := lagBuckets(text)
	o.p50, o.p99 = quantile(buckets, 0.5), quantile(buckets, 0.99)
	var cum []string
	for _, b := range buckets {
		cum = append(cum, fmt.Sprintf("%g:%.0f", b.le, b.count))
	}
	fmt.Printf("kvload %d/s lag buckets (le seconds: cumulative count): %s\n", rate, strings.Join(cum, " "))
	// The percentiles from the native buckets where the exporter has them;
	// the classic ones' stay in the line for comparison.
	native, err := nativeLagBuckets("http://" + web + "/metrics")
	if err != nil {
		return o, err
	}
	if native != nil {
		o.lagSource = fmt.Sprintf("kvload_schedule_lag_seconds, native buckets, interpolated; classic buckets: p50 %s p99 %s", ms(o.p50), ms(o.p99))
		o.p50, o.p99 = quantile(native, 0.5), quantile(native, 0.99)
	}
	return o, nil
}

// runVegeta attacks the sink at rate for dur with one fixed chat request
// like the exporter's. Its send lag is its hit's start time minus the
// schedule: a constant rate from the first hit, aligned on the earliest
// hit, so the lag is relative to vegeta's best-kept hit (never negative).
func runVegeta(ctx context.Context, su setup, rate int) (outcome, error) {
	bin, dir, sinkURL, sinkPid, dur := su.vegeta, su.dir, su.sinkURL, su.sinkPid, su.dur
	o := outcome{tool: "vegeta", rate: rate, lagSource: "result timestamp − seq/rate, aligned on the earliest"}
	body := `{"model":"bench","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum ", 32) +
		`"}],"max_tokens":` + strconv.Itoa(su.tokens) + `,"stream":true,"stream_options":{"include_usage":true}}`
	target, err := json.Marshal(map[string]any{
		"method": "POST",
		"url":    sinkURL + "/v1/chat/completions",
		"body":   base64.StdEncoding.EncodeToString([]byte(body)),
		"header": map[string][]string{"Content-Type": {"application/json"}, "Accept": {"text/event-stream"}},
	})
	if err != nil {
		return o, err
	}
	targets := filepath.Join(dir, "targets.json")
	if err := os.WriteFile(targets, append(target, '\n'), 0o644); err != nil {
		return o, err
	}
	results := filepath.Join(dir, fmt.Sprintf("vegeta%d.bin", rate))
	if err := resetSink(sinkURL); err != nil {
		return o, err
	}
	sink0, start := procCPU(sinkPid), time.Now()
	// -max-body 0: every byte of the stream is read, none kept.
	cmd := exec.CommandContext(ctx, bin, "attack", "-format=json", "-targets="+targets, "-rate="+strconv.Itoa(rate)+"/1s",
		"-duration="+dur.String(), "-max-body=0", "-output="+results)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return o, fmt.Errorf("vegeta attack: %w", err)
	}
	sink1, wall := procCPU(sinkPid), time.Since(start)
	// The same counters /proc/<pid>/stat shows (utime, stime), read by
	// wait4 when vegeta exits: its whole life, start-up included.
	o.toolCPU = cmd.ProcessState.UserTime().Seconds() + cmd.ProcessState.SystemTime().Seconds()
	o.toolSys = cmd.ProcessState.SystemTime().Seconds()
	o.sinkCPU = sink1 - sink0
	o.machineBusy = machineShare(o.toolCPU+o.sinkCPU, runtime.NumCPU(), wall)
	st, err := sinkStatsOf(sinkURL)
	if err != nil {
		return o, err
	}
	o.sent, o.unstamped = st.Requests, st.Unstamped
	if err := o.judgeAtSink(sinkURL); err != nil {
		return o, err
	}
	o.dropped = neverSent(rate, dur, o.sent)

	f, err := os.Open(results)
	if err != nil {
		return o, err
	}
	defer f.Close()
	dec := vegeta.NewDecoder(f)
	var starts []time.Duration // hit start times, Unix
	failed := 0
	for {
		var r vegeta.Result
		if err := dec.Decode(&r); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return o, fmt.Errorf("decode vegeta results: %w", err)
		}
		if r.Code != http.StatusOK {
			failed++
		}
		starts = append(starts, time.Duration(r.Timestamp.UnixNano()))
	}
	if failed > 0 {
		fmt.Printf("vegeta: %d of %d requests failed\n", failed, len(starts))
	}
	if len(starts) == 0 {
		return o, errors.New("vegeta recorded no results")
	}
	// Vegeta numbers its hits as they start, so its own order is the
	// order of start times: the same formula as the sink's.
	o.p50, o.p99 = arrivalLag(starts, rate)
	return o, nil
}

// checkRunSize refuses a run the sink's arrival log cannot hold: each run
// is judged from it, and it keeps the first maxArrivals arrivals, so a
// longer run would be judged on a part of it.
func checkRunSize(rates []int, opt options) error {
	runRates := slices.Clone(rates)
	if opt.storm > 0 {
		runRates = append(runRates, opt.stormRate)
	}
	for _, rate := range runRates {
		if n := float64(rate) * opt.dur.Seconds(); n > maxArrivals {
			return fmt.Errorf("%d/s for -duration %v is %.0f requests a run, more than the sink's arrival log keeps (%d)", rate, opt.dur, n, maxArrivals)
		}
	}
	return nil
}

// judgeAtSink sets the achieved rate and the lag at the sink from the
// arrival times (Unix) of the requests the sink received since its last
// reset: the same figures, by the same formulas, whichever tool sent them.
// The lag and the rate are the kernel's receive stamps' (wire.go); the lag
// at the sink's handler is kept beside them.
func (o *outcome) judgeAtSink(url string) error {
	received, err := o.sinkArrivals(url, "received")
	if err != nil {
		return err
	}
	handled, err := o.sinkArrivals(url, "handled")
	if err != nil {
		return err
	}
	o.achieved = arrivalRate(received)
	o.sinkP50, o.sinkP99 = arrivalLag(received, o.rate)
	o.handlerP50, o.handlerP99 = arrivalLag(handled, o.rate)
	return nil
}

// keepArrivals is -keep-arrivals: where each run's arrival logs go, for a
// look at their shape; empty for nowhere.
var keepArrivals string

// sinkArrivals reads the sink's arrival log of the given kind, "received"
// or "handled", and keeps a copy under -keep-arrivals.
func (o *outcome) sinkArrivals(sinkURL, kind string) ([]time.Duration, error) {
	text, err := get(sinkURL + "/arrivals?at=" + kind)
	if err != nil {
		return nil, err
	}
	var unix []int64
	if err := json.Unmarshal([]byte(text), &unix); err != nil {
		return nil, fmt.Errorf("sink arrivals: %w", err)
	}
	if keepArrivals != "" {
		name := fmt.Sprintf("%s-%d-%d-%s.json", strings.TrimSuffix(strings.Fields(o.tool)[0], ","), o.rate, time.Now().UnixNano(), kind)
		if err := os.WriteFile(filepath.Join(keepArrivals, name), []byte(text), 0o644); err != nil {
			return nil, fmt.Errorf("keep the arrivals: %w", err)
		}
	}
	if len(unix) == 0 {
		return nil, errors.New("the sink recorded no arrivals")
	}
	times := make([]time.Duration, len(unix))
	for i, t := range unix {
		times[i] = time.Duration(t)
	}
	return times, nil
}

// arrivalRate is the rate that requests arriving at the given times were
// kept at: the inverse of the least-squares slope of the k-th earliest
// time against k. The first and the last arrival alone would make it move
// with the lag of two requests: at 5,000/s over 10 s, a last request 1 ms
// late takes 0.5/s off, which a tool's median then loses to vegeta's by.
func arrivalRate(times []time.Duration) float64 {
	n := len(times)
	if n < 2 {
		return 0
	}
	times = slices.Clone(times)
	slices.Sort(times)
	var sumK, sumT, sumKK, sumKT float64
	for k, t := range times {
		x, y := float64(k), (t - times[0]).Seconds()
		sumK += x
		sumT += y
		sumKK += x * x
		sumKT += x * y
	}
	fn := float64(n)
	slope := (fn*sumKT - sumK*sumT) / (fn*sumKK - sumK*sumK) // seconds per request
	if !(slope > 0) {
		return 0
	}
	return 1 / slope
}

// arrivalLag is the send lag of requests started (or received) at the
// given times against a constant rate: the k-th earliest is compared with
// the k-th slot of the schedule, and the schedule starts where the
// best-kept request puts it, so no lag is negative. Whatever the tool, the
// requests are matched to the schedule the same way: by order, not by
// which row each one was.
func arrivalLag(times []time.Duration, rate int) (p50, p99 time.Duration) {
	times = slices.Clone(times)
	slices.Sort(times)
	interval := time.Second / time.Duration(rate)
	offsets := make([]time.Duration, len(times))
	for k, t := range times {
		offsets[k] = t - time.Duration(k)*interval
	}
	slices.Sort(offsets)
	pct := func(q float64) time.Duration { return offsets[int(q*float64(len(offsets)-1))] - offsets[0] }
	return pct(0.5), pct(0.99)
}

// scrapeStorm starts n scrapers fetching url, each pausing gap between
// scrapes; the function it returns stops them, waits for them and counts
// their answers by status.
func scrapeStorm(ctx context.Context, url string, n int, gap time.Duration) func() map[int]int {
	ctx, cancel := context.WithCancel(ctx)
	codes := make(chan map[int]int, n)
	for range n {
		go func() {
			seen := map[int]int{}
			defer func() { codes <- seen }()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					return
				}
				resp, err := client.Do(req)
				if err != nil {
					seen[0]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				seen[resp.StatusCode]++
				if gap > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(gap):
					}
				}
			}
		}()
	}
	return func() map[int]int {
		cancel()
		total := map[int]int{}
		for range n {
			for c, k := range <-codes {
				total[c] += k
			}
		}
		return total
	}
}

func resetSink(url string) error {
	_, err := get(url + "/reset")
	return err
}

func sinkStatsOf(url string) (sinkStats, error) {
	var st sinkStats
	text, err := get(url + "/stats")
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal([]byte(text), &st)
}

// waitSink waits until the sink has seen want requests, or, once the run
// should be over, until the count stops moving (the tool dropped some).
func waitSink(url string, want int64, dur time.Duration) (sinkStats, error) {
	start := time.Now()
	var last sinkStats
	for {
		time.Sleep(250 * time.Millisecond)
		st, err := sinkStatsOf(url)
		if err != nil {
			return st, err
		}
		if st.Requests >= want || (time.Since(start) > dur+2*time.Second && st.Requests == last.Requests) {
			return st, nil
		}
		if time.Since(start) > dur+60*time.Second {
			return st, fmt.Errorf("sink saw %d of %d requests after %v", st.Requests, want, time.Since(start))
		}
		last = st
	}
}

// captureGzip fetches url as the scrapers do (asking for gzip) and keeps
// the answer as sent, still compressed.
func captureGzip(url string) (*capturedResponse, error) {
	h, b, err := fetch(&http.Client{Transport: &http.Transport{DisableCompression: true}}, url, "gzip")
	if err != nil {
		return nil, err
	}
	h.Del("Date")
	h.Del("Content-Length")
	return &capturedResponse{header: h, body: b}, nil
}

func get(url string) (string, error) {
	_, b, err := fetch(http.DefaultClient, url, "")
	return string(b), err
}

// fetch GETs url (with Accept-Encoding when encoding is set) and returns
// the headers and body of a 200 answer.
func fetch(c *http.Client, url, encoding string) (http.Header, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp.Header, b, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// procCPU is utime+stime of pid in seconds from /proc/<pid>/stat (clock
// ticks of 1/100 s on Linux); NaN where it cannot be read.
func procCPU(pid int) float64 { return procTicks(pid, true, true) }

// procSys is stime alone.
func procSys(pid int) float64 { return procTicks(pid, false, true) }

func procTicks(pid int, user, sys bool) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return math.NaN()
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return math.NaN()
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return math.NaN()
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return math.NaN()
	}
	if !user {
		u = 0
	}
	if !sys {
		s = 0
	}
	return (u + s) / 100
}

// sumSeries adds up every sample of a counter in the text format.
func sumSeries(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

type bucket struct{ le, count float64 }

// lagBuckets reads the classic buckets of kvload_schedule_lag_seconds,
// summed over series.
func lagBuckets(text string) []bucket {
	sums := map[float64]float64{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "kvload_schedule_lag_seconds_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		if i < 0 {
			continue
		}
		rest := line[i+4:]
		le, err := strconv.ParseFloat(rest[:strings.IndexByte(rest, '"')], 64)
		if err != nil {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sums[le] += v
		}
	}
	return sortedBuckets(sums)
}

// sortedBuckets turns counts by upper bound into buckets in order of bound.
func sortedBuckets(byBound map[float64]float64) []bucket {
	bs := make([]bucket, 0, len(byBound))
	for le, c := range byBound {
		bs = append(bs, bucket{le, c})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	return bs
}

// quantile interpolates within the classic buckets, as PromQL's
// histogram_quantile does.
func quantile(bs []bucket, q float64) time.Duration {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return time.Duration(lower * 1e9)
			}
			frac := 1.0
			if b.count > below {
				frac = (rank - below) / (b.count - below)
			}
			return time.Duration((lower + (b.le-lower)*frac) * 1e9)
		}
		lower, below = b.le, b.count
	}
	return time.Duration(lower * 1e9)
}

// machineShare is cpu CPU-seconds as a share of the CPU time that cpus
// CPUs had over wall.
func machineShare(cpu float64, cpus int, wall time.Duration) float64 {
	if wall <= 0 || cpus < 1 {
		return math.NaN()
	}
	return cpu / (float64(cpus) * wall.Seconds())
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			return strings.TrimSpace(l[strings.IndexByte(l, ':')+1:])
		}
	}
	return "unknown CPU"
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
