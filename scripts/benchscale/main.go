// Command benchscale measures the exporter against a big trace: the time
// from exec to the first request and the resident memory while replaying,
// without synthesis and with a speed-up, a cap and a prefix multiplier; the
// memory of one workload against 50 targets next to one; and what a
// reload that adds, changes and removes a small workload does to a big one
// beside it. It runs the built binary against a sink of its own, which
// answers every request with a short stream and notes when each target's
// requests arrive.
//
// usage: go run ./scripts/benchscale -bin bin/kvload-exporter -trace BIG.jsonl -small SMALL.jsonl
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	bin := flag.String("bin", "bin/kvload-exporter", "the exporter binary")
	trace := flag.String("trace", "", "the big trace")
	small := flag.String("small", "", "a small trace for the workload a reload adds")
	phases := flag.String("phases", "startup,targets,reload", "what to measure, comma-separated")
	synthesis := flag.String("synthesis", defaultSynthesis, "the synthesis settings start-up is measured with, ;-separated")
	settle := flag.Duration("settle", 20*time.Second, "how long each run replays before it is measured")
	flag.Parse()
	if *trace == "" || *small == "" {
		fmt.Fprintln(os.Stderr, "benchscale: -trace and -small are required")
		os.Exit(2)
	}
	b := &bench{bin: *bin, trace: abs(*trace), small: abs(*small), settle: *settle, synthesis: strings.Split(*synthesis, ";")}
	for _, p := range strings.Split(*phases, ",") {
		var err error
		switch p {
		case "startup":
			err = b.startup()
		case "targets":
			err = b.targets()
		case "reload":
			err = b.reload()
		default:
			err = fmt.Errorf("unknown phase %q", p)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchscale: %s: %v\n", p, err)
			os.Exit(1)
		}
	}
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

type bench struct {
	bin, trace, small string
	settle            time.Duration
	synthesis         []string // "none" or a YAML flow mapping
}

// defaultSynthesis: the workload's synthesis settings start-up is
// measured with, as YAML flow mappings separated by ";" ("none" is none): a
// speed-up, as every canary sets, alone and with a cap and a prefix
// multiplier.
const defaultSynthesis = "none;{speedup_ratio: 147};{speedup_ratio: 147, max_osl: 16};{speedup_ratio: 147, prefix_len_multiplier: 2}"

// startup: exec to first request, and memory while replaying, with each
// of b.synthesis.
func (b *bench) startup() error {
	rows, err := countLines(b.trace)
	if err != nil {
		return err
	}
	for _, syn := range b.synthesis {
		if syn = strings.TrimSpace(syn); syn == "none" {
			syn = ""
		}
		if err := b.startupWith(syn, rows); err != nil {
			return fmt.Errorf("synthesis %q: %w", syn, err)
		}
	}
	return nil
}

func (b *bench) startupWith(synthesis string, rows int) error {
	s, err := newSink()
	if err != nil {
		return err
	}
	defer s.close()
	// loop: once starts at the trace's first row, due at once: a looping
	// workload would wait for its next row on the pass grid, up to the
	// trace's longest gap (3 s here), which is not start-up.
	r, err := b.run(s, config(s, []workload{{name: "big", trace: b.trace, targets: 1, loop: "once", synthesis: synthesis}}))
	if err != nil {
		return err
	}
	defer r.stop()
	ready := r.waitReady(2 * time.Minute)
	first, err := s.waitFirst("t0", 2*time.Minute)
	if err != nil {
		return err
	}
	r.sampleFor(b.settle)
	what := "no synthesis"
	if synthesis != "" {
		what = "synthesis " + synthesis
	}
	fmt.Printf("startup, %s: %d rows; ready %.2f s and first request %.2f s after exec; resident %s now, %s at peak (%.0f bytes a row at peak, whole process)\n",
		what, rows, ready.Sub(r.started).Seconds(), first.Sub(r.started).Seconds(), mib(r.rss), mib(r.peak), float64(r.peak)/float64(rows))
	estimate, err := b.estimate(r.config)
	if err != nil {
		return err
	}
	fmt.Printf("startup, %s: --config.check estimates %s, %+.1f %% of the peak\n", what, mib(estimate), 100*(float64(estimate)/float64(r.peak)-1))
	return nil
}

// estimate is the total of the memory estimate --config.check prints for
// the configuration file cfg, in bytes.
func (b *bench) estimate(cfg string) (int64, error) {
	out, err := exec.Command(b.bin, "--config.check", "--config.file="+cfg).Output()
	if err != nil {
		return 0, fmt.Errorf("--config.check: %w: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "total" && f[2] == "MiB" {
			v, err := strconv.ParseFloat(f[1], 64)
			return int64(v * (1 << 20)), err
		}
	}
	return 0, fmt.Errorf("--config.check printed no total: %s", out)
}

// targets: 1 workload × 50 targets against 1 × 1.
func (b *bench) targets() error {
	var res [2]int64
	for i, n := range []int{1, 50} {
		s, err := newSink()
		if err != nil {
			return err
		}
		r, err := b.run(s, config(s, []workload{{name: "big", trace: b.trace, targets: n}}))
		if err != nil {
			s.close()
			return err
		}
		_, err = s.waitFirst(fmt.Sprintf("t%d", n-1), 2*time.Minute)
		if err == nil {
			r.sampleFor(b.settle)
			res[i] = r.rss
			fmt.Printf("targets: 1 workload × %d targets: resident %s after %v of replay (peak %s), %d requests\n",
				n, mib(r.rss), b.settle, mib(r.peak), s.total())
		}
		r.stop()
		s.close()
		if err != nil {
			return err
		}
	}
	fmt.Printf("targets: each target beyond the first costs %s\n", mib((res[1]-res[0])/49))
	return nil
}

// reload: a small workload added, changed and removed next to the big one.
func (b *bench) reload() error {
	s, err := newSink()
	if err != nil {
		return err
	}
	defer s.close()
	big := workload{name: "big", trace: b.trace, targets: 1}
	r, err := b.run(s, config(s, []workload{big}))
	if err != nil {
		return err
	}
	defer r.stop()
	if _, err := s.waitFirst("t0", 2*time.Minute); err != nil {
		return err
	}
	// The baseline: the big workload alone, over the same window.
	r.sampleFor(b.settle / 2)
	start, err := r.scrape()
	if err != nil {
		return err
	}
	quiet := time.Now()
	bigBefore := s.count("t0")
	window := b.settle
	r.sampleFor(window)
	before, err := r.scrape()
	if err != nil {
		return err
	}
	d := before.sub(start)
	fmt.Printf("reload baseline: big workload alone: %d sent, %d dropped, schedule lag p99 %s over %v; longest gap between its requests %.2f s; resident %s\n",
		s.count("t0")-bigBefore, int64(d.dropped), d.p99(), window, s.longestGap("t0", quiet).Seconds(), mib(r.rss))
	steps := []struct {
		what string
		ws   []workload
		path string // the sink path whose first request is waited for
	}{
		{"add", []workload{big, {name: "small", trace: b.small, targets: 1, path: "s0"}}, "s0"},
		{"change", []workload{big, {name: "small", trace: b.small, targets: 1, path: "s1", inFlight: 7}}, "s1"},
		{"remove", []workload{big}, ""},
	}
	for _, st := range steps {
		bigBefore := s.count("t0")
		changed := time.Now()
		if err := writeFile(r.config, config(s, st.ws)); err != nil {
			return err
		}
		if st.path != "" {
			first, err := s.waitFirst(st.path, time.Minute)
			if err != nil {
				return err
			}
			fmt.Printf("reload %s: the new workload's first request %.2f s after the file changed\n", st.what, first.Sub(changed).Seconds())
		}
		r.sampleFor(window)
		after, err := r.scrape()
		if err != nil {
			return err
		}
		d := after.sub(before)
		fmt.Printf("reload %s: big workload: %d sent, %d dropped, schedule lag p99 %s over the %v after; longest gap between its requests %.2f s; resident %s (peak %s)\n",
			st.what, s.count("t0")-bigBefore, int64(d.dropped), d.p99(), window, s.longestGap("t0", changed).Seconds(), mib(r.rss), mib(r.peak))
		before = after
	}
	return nil
}

// workload is one workload of a generated configuration.
type workload struct {
	name, trace string
	targets     int
	path        string // the sink path of its target, when it has its own
	inFlight    int
	loop        string // "" is fresh
	synthesis   string // a YAML flow mapping; "" is none
}

// config writes a configuration: the big workload's targets are t0..tN-1
// on the sink, a small workload has a target of its own.
func config(s *sink, ws []workload) string {
	var t, w strings.Builder
	t.WriteString("targets:\n")
	w.WriteString("workloads:\n")
	target := func(name string) {
		fmt.Fprintf(&t, "  - name: %s\n    url: %s/%s\n    model: m\n    cache: {block_size: 16, capacity_blocks: 65536}\n", name, s.url, name)
	}
	for _, wl := range ws {
		var names []string
		if wl.path != "" {
			target(wl.path)
			names = append(names, wl.path)
		} else {
			for i := range wl.targets {
				target(fmt.Sprintf("t%d", i))
				names = append(names, fmt.Sprintf("t%d", i))
			}
		}
		loop := wl.loop
		if loop == "" {
			loop = "fresh"
		}
		inFlight := wl.inFlight
		if inFlight == 0 {
			inFlight = 64 // the default of these runs; a set value is kept as set
		}
		fmt.Fprintf(&w, "  - name: %s\n    trace: %s\n    targets: [%s]\n    loop: %s\n    max_in_flight: %d\n",
			wl.name, wl.trace, strings.Join(names, ", "), loop, inFlight)
		if wl.synthesis != "" {
			fmt.Fprintf(&w, "    synthesis: %s\n", wl.synthesis)
		}
	}
	return t.String() + w.String()
}

func writeFile(path, body string) error {
	// Renamed into place, so the watcher never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// running is an exporter process.
type running struct {
	cmd     *exec.Cmd
	started time.Time
	config  string
	metrics string
	dir     string
	rss     int64 // last sampled
	peak    int64
}

func (b *bench) run(s *sink, cfg string) (*running, error) {
	dir, err := os.MkdirTemp("", "benchscale")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &running{config: filepath.Join(dir, "kvload.yml"), dir: dir, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port)}
	if err := writeFile(r.config, cfg); err != nil {
		return nil, err
	}
	r.cmd = exec.Command(b.bin, "--config.file="+r.config, fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port),
		"--shutdown.drain-timeout=1s", "--log.level=warn")
	r.cmd.Stdout, r.cmd.Stderr = os.Stderr, os.Stderr
	r.started = time.Now()
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	return r, nil
}

// waitReady polls /-/ready until it answers 200 (every 10 ms).
func (r *running) waitReady(within time.Duration) time.Time {
	url := strings.TrimSuffix(r.metrics, "/metrics") + "/-/ready"
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now()
			}
		}
	}
	return time.Time{}
}

// stop interrupts the daemon and waits for it, killing it after 30 s. Its
// exit status is not looked at: the figures were taken before.
func (r *running) stop() {
	// A process that has already exited cannot be signalled; Wait below
	// returns at once then.
	_ = r.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
	os.RemoveAll(r.dir)
}

// sampleFor samples the resident memory every 100 ms for d.
func (r *running) sampleFor(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if rss, hwm, err := procMemory(r.cmd.Process.Pid); err == nil {
			r.rss, r.peak = rss, max(r.peak, hwm)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procMemory reads VmRSS and VmHWM (the peak) of a process, in bytes.
func procMemory(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fields[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	return rss, hwm, sc.Err()
}

// counters are the big workload's series, from /metrics.
type counters struct {
	dropped float64
	lag     map[float64]float64 // cumulative bucket counts by upper bound
}

func (r *running) scrape() (counters, error) {
	c := counters{lag: map[float64]float64{}}
	resp, err := http.Get(r.metrics)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `workload="big"`) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "kvload_requests_dropped_total{"):
			c.dropped += v
		case strings.HasPrefix(line, "kvload_schedule_lag_seconds_bucket{"):
			_, le, _ := strings.Cut(line, `le="`)
			le, _, _ = strings.Cut(le, `"`)
			bound, err := strconv.ParseFloat(le, 64)
			if err == nil {
				c.lag[bound] += v
			}
		}
	}
	return c, sc.Err()
}

func (c counters) sub(o counters) counters {
	d := counters{dropped: c.dropped - o.dropped, lag: map[float64]float64{}}
	for k, v := range c.lag {
		d.lag[k] = v - o.lag[k]
	}
	return d
}

// p99 is the upper bound of the bucket holding the 99th percentile.
func (c counters) p99() string {
	bounds := make([]float64, 0, len(c.lag))
	for k := range c.lag {
		bounds = append(bounds, k)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 || c.lag[math.Inf(1)] == 0 {
		return "n/a (no request)"
	}
	total := c.lag[math.Inf(1)]
	for _, b := range bounds {
		if c.lag[b] >= 0.99*total {
			return fmt.Sprintf("≤ %g s (%g requests)", b, total)
		}
	}
	return "?"
}

// sink answers every chat completion with a short stream.
type sink struct {
	srv *http.Server
	url string
	mu  sync.Mutex
	at  map[string][]time.Time // arrivals by first path element
	new *sync.Cond
}

func newSink() (*sink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{url: "http://" + l.Addr().String(), at: map[string][]time.Time{}}
	s.new = sync.NewCond(&s.mu)
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve)}
	// Serve returns http.ErrServerClosed once close is called; a sink that
	// fails before shows as requests that never arrive.
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *sink) close() { _ = s.srv.Shutdown(context.Background()) }

// sinkStream is the sink's answer: four one-token chunks, the usage and
// [DONE].
var sinkStream = strings.Repeat(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" x"},"finish_reason":null}]}`+"\n\n", 4) +
	`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}` + "\n\n" +
	"data: [DONE]\n\n"

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	now := time.Now()
	// The request has arrived whatever its body holds.
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.at[name] = append(s.at[name], now)
	s.new.Broadcast()
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	// A client that has gone reads nothing more; the sink has no one to tell.
	_, _ = io.WriteString(w, sinkStream)
}

// waitFirst waits for the first request to name.
func (s *sink) waitFirst(name string, within time.Duration) (time.Time, error) {
	timer := time.AfterFunc(within, func() { s.mu.Lock(); s.new.Broadcast(); s.mu.Unlock() })
	defer timer.Stop()
	deadline := time.Now().Add(within)
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.at[name]) == 0 {
		if time.Now().After(deadline) {
			return time.Time{}, errors.New("no request to " + name + " within " + within.String())
		}
		s.new.Wait()
	}
	return s.at[name][0], nil
}

func (s *sink) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at[name])
}

func (s *sink) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.at {
		n += len(a)
	}
	return n
}

// longestGap is the longest time between two requests to name since from.
func (s *sink) longestGap(name string, from time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gap time.Duration
	prev := from
	for _, t := range s.at[name] {
		if t.Before(from) {
			continue
		}
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	return gap
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	buf := make([]byte, 1<<20)
	for {
		k, err := f.Read(buf)
		n += strings.Count(string(buf[:k]), "\n")
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
