package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// The default schedule reads a failing target at most discoverRetryMax
// apart, so that one that comes up is read within two minutes, and one
// whose layout is known every discoverRefresh.
func TestDiscoveryScheduleWait(t *testing.T) {
	s := defaultDiscovery
	for _, tt := range []struct {
		failures int
		want     time.Duration
	}{
		{0, 5 * time.Minute},
		{1, 15 * time.Second},
		{2, 30 * time.Second},
		{3, 30 * time.Second},
		{1000, 30 * time.Second},
	} {
		if got := s.wait(tt.failures); got != tt.want {
			t.Errorf("wait after %d failures: %v, want %v", tt.failures, got, tt.want)
		}
	}
	if worst := s.retryMax + discoverTimeout; worst >= 2*time.Minute {
		t.Errorf("a target that comes up may wait %v to be read, not within two minutes", worst)
	}
}

// fakeWatch drives a layoutWatch's loop by hand: each timer it arms is
// handed to the test, which fires it; each read takes its result from the
// test; each reading it reports comes back to the test.
type fakeWatch struct {
	*layoutWatch
	armed    chan fakeTimer
	results  chan error // nil: a layout of 100 blocks
	readings chan layoutReading
}

type fakeTimer struct {
	wait    time.Duration
	fire    chan time.Time
	stopped chan struct{} // closed by stop
}

func newFakeWatch(t *testing.T, failures int, down bool) *fakeWatch {
	t.Helper()
	f := &fakeWatch{armed: make(chan fakeTimer), results: make(chan error), readings: make(chan layoutReading)}
	ctx, cancel := context.WithCancel(t.Context())
	f.layoutWatch = &layoutWatch{schedule: defaultDiscovery, recovered: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}),
		newTimer: func(d time.Duration) (<-chan time.Time, func() bool) {
			ft := fakeTimer{wait: d, fire: make(chan time.Time, 1), stopped: make(chan struct{})}
			select {
			case f.armed <- ft:
			case <-ctx.Done():
			}
			return ft.fire, func() bool { close(ft.stopped); return true }
		},
		read: func(ctx context.Context) layoutReading {
			select {
			case err := <-f.results:
				if err != nil {
					return layoutReading{err: err}
				}
				return layoutReading{layout: engine.Layout{BlockSize: 16, Blocks: 100}}
			case <-ctx.Done():
				return layoutReading{err: ctx.Err()}
			}
		},
	}
	f.down.Store(down)
	go f.run(ctx, failures, func(ctx context.Context, r layoutReading) bool {
		select {
		case f.readings <- r:
			return true
		case <-ctx.Done():
			return false
		}
	})
	t.Cleanup(func() {
		cancel()
		<-f.done
	})
	return f
}

// next takes the timer the loop armed and checks its wait.
func (f *fakeWatch) next(t *testing.T, want time.Duration) fakeTimer {
	t.Helper()
	ft := testutil.Wait(t, "a timer armed", f.armed)
	if ft.wait != want {
		t.Fatalf("the next read is %v away, want %v", ft.wait, want)
	}
	return ft
}

// read answers the loop's read with err and takes the reading it reports.
func (f *fakeWatch) read(t *testing.T, err error) {
	t.Helper()
	f.results <- err
	r := testutil.Wait(t, "the reading reported", f.readings)
	if !errors.Is(r.err, err) || r.watch != f.layoutWatch {
		t.Fatalf("reported %+v, want the error %v from this watch", r, err)
	}
}

var (
	errDown     = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	errNoLayout = errors.New("vllm:cache_config_info not found in /metrics")
)

// TestLayoutWatchSchedule runs a watch on a fake clock: often while its
// reads fail (15 s, then 30 s), rarely once one succeeded (5 min), and at
// once when the target answers a request after a read found it down, not
// after a read it answered badly.
func TestLayoutWatchSchedule(t *testing.T) {
	f := newFakeWatch(t, 1, false) // the read at start failed
	f.next(t, 15*time.Second).fire <- time.Time{}
	f.read(t, errDown)
	f.next(t, 30*time.Second).fire <- time.Time{}
	f.read(t, errDown)
	f.next(t, 30*time.Second).fire <- time.Time{}
	f.read(t, nil)
	f.next(t, 5*time.Minute).fire <- time.Time{}
	f.read(t, nil)
	f.next(t, 5*time.Minute).fire <- time.Time{}
	f.read(t, errDown) // the target went away

	// It is down: the first answer to a request hastens the read.
	ft := f.next(t, 15*time.Second)
	f.answered()
	testutil.Wait(t, "the timer stopped by an answer", ft.stopped)
	f.read(t, nil)
	f.answered() // up: nothing to hasten
	ft = f.next(t, 5*time.Minute)
	ft.fire <- time.Time{}
	f.read(t, errNoLayout)
	// It answers without a layout: an answer to a request says nothing
	// new. Had it hastened the read, the timer would be stopped before it.
	ft = f.next(t, 15*time.Second)
	f.answered()
	ft.fire <- time.Time{}
	f.read(t, errDown)
	notStopped(t, ft, "an answer hastened the read of a target that answers without a layout")
	// Down again: a hastened read that fails does not arm another.
	ft = f.next(t, 30*time.Second)
	f.answered()
	testutil.Wait(t, "the timer stopped by an answer", ft.stopped)
	f.read(t, errDown)
	ft = f.next(t, 30*time.Second)
	f.answered()
	ft.fire <- time.Time{}
	f.read(t, nil)
	notStopped(t, ft, "a hastened read that failed armed another")
	f.next(t, 5*time.Minute)
}

func notStopped(t *testing.T, ft fakeTimer, what string) {
	t.Helper()
	select {
	case <-ft.stopped:
		t.Error(what)
	default:
	}
}

// TestLayoutWatchStartsDown: a watch started after the read at start
// found the target down reads at once when the target answers.
func TestLayoutWatchStartsDown(t *testing.T) {
	f := newFakeWatch(t, 1, true)
	ft := f.next(t, 15*time.Second)
	f.answered()
	testutil.Wait(t, "the timer stopped by an answer", ft.stopped)
	f.read(t, nil)
	f.next(t, 5*time.Minute)
}

// freeAddress is a loopback address where nothing listens (for now).
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// discoveryDaemon starts a daemon of cfg with the given discovery
// schedule, logging to logs.
func discoveryDaemon(t *testing.T, cfg config.Config, s discoverySchedule, logs *testutil.Buffer) *started {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, func(o *Options) {
		o.Logger = log.NewLogfmtLogger(logs)
		o.discovery = s
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// steadyConfig replays a request every 20 ms, forever, against a vLLM
// target at url whose cache size is auto.
func steadyConfig(t *testing.T, url string) config.Config {
	t.Helper()
	cfg := daemontest.Config(url, daemontest.SteadyTrace(t, t.TempDir()))
	cfg.Workloads[0].Loop = "repeat"
	cfg.Workloads[0].MaxInFlight = 8
	return cfg
}

// modelParams is the cache the model of the unit (w, t) stands for now. The
// owner goroutine never writes d.units.byKey outside a reload.
func (d *started) modelParams(t *testing.T) replay.CacheParams {
	t.Helper()
	u := d.units.byKey[unitKey{"w", "t"}]
	if u == nil {
		t.Fatal("no unit (w, t)")
	}
	return u.workload.Cache().Params()
}

// TestDiscoveryTargetDownAtStart: a vLLM target that is down when the
// exporter starts is modelled unbounded, capacity unknown; once it comes
// up, its capacity is read without a reload, on the schedule or as soon as
// a request finds it answering, and the unit's model takes it.
func TestDiscoveryTargetDownAtStart(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		schedule discoverySchedule
	}{
		// Reads every 50 ms; answers to requests are not listened to.
		{"on the schedule", discoverySchedule{retry: 50 * time.Millisecond, retryMax: 50 * time.Millisecond, refresh: time.Hour, ignoreAnswers: true}},
		// A schedule that never reads during the test: only an answer
		// can bring the read on.
		{"when a request is answered", discoverySchedule{retry: time.Hour, retryMax: time.Hour, refresh: time.Hour}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr := freeAddress(t)
			var logs testutil.Buffer
			d := discoveryDaemon(t, steadyConfig(t, "http://"+addr), tt.schedule, &logs)
			mfs := testutil.Gather(t, d.reg)
			if known, _ := mfs.Value("kvload_target_cache_capacity_known"); known != 0 {
				t.Fatalf("capacity known %v with the target down", known)
			}
			if n, _ := mfs.Value("kvload_target_cache_discovery_failures_total", "reason", "unreachable"); n < 1 {
				t.Errorf("%v failed reads counted as unreachable, want the one at start", n)
			}
			if p := d.modelParams(t); p.CapacityBlocks != 0 {
				t.Fatalf("the model holds %d blocks with the capacity unknown, want unbounded", p.CapacityBlocks)
			}

			daemontest.StartEmulatorAt(t, emulate.Config{Model: "m", BlockSize: 16, CapacityBlocks: 777}, addr)
			testutil.Eventually(t, "the capacity read", func() (bool, string) {
				mfs := testutil.Gather(t, d.reg)
				blocks, _ := mfs.Value("kvload_target_cache_capacity_blocks")
				known, _ := mfs.Value("kvload_target_cache_capacity_known")
				changes, _ := mfs.Value("kvload_target_cache_layout_changes_total")
				return blocks == 777 && known == 1 && changes == 1, fmt.Sprintf("%v blocks, known %v, %v changes", blocks, known, changes)
			})
			if p := d.modelParams(t); p.CapacityBlocks != 777 || p.ServerBlock != 16 {
				t.Errorf("the unit's model stands for %d blocks of %d tokens, want 777 of 16", p.CapacityBlocks, p.ServerBlock)
			}
			note := d.Status().Targets[0].CacheNote
			if !strings.Contains(note, "read from vllm:cache_config_info, changed from unknown capacity, 16-token blocks to 777 blocks of 16 tokens at ") {
				t.Errorf("the landing page's note: %q", note)
			}
			if !strings.Contains(logs.String(), `msg="the target's KV cache layout changed`) || !strings.Contains(logs.String(), `new="777 blocks of 16 tokens"`) {
				t.Errorf("the change is not logged with its values:\n%s", logs.String())
			}
		})
	}
}

// TestDiscoveryReloadReadsUnknown: a reload reads again a target whose
// layout is unknown, though its configuration did not change.
func TestDiscoveryReloadReadsUnknown(t *testing.T) {
	t.Parallel()
	addr := freeAddress(t)
	var logs testutil.Buffer
	never := discoverySchedule{retry: time.Hour, retryMax: time.Hour, refresh: time.Hour, ignoreAnswers: true}
	d := discoveryDaemon(t, steadyConfig(t, "http://"+addr), never, &logs)
	daemontest.StartEmulatorAt(t, emulate.Config{Model: "m", BlockSize: 16, CapacityBlocks: 555}, addr)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The reload is done: no waiting.
	mfs := testutil.Gather(t, d.reg)
	blocks, _ := mfs.Value("kvload_target_cache_capacity_blocks")
	known, _ := mfs.Value("kvload_target_cache_capacity_known")
	if blocks != 555 || known != 1 {
		t.Errorf("after the reload: %v blocks, known %v; want 555, 1", blocks, known)
	}
	if p := d.modelParams(t); p.CapacityBlocks != 555 {
		t.Errorf("the unit's model stands for %d blocks, want 555", p.CapacityBlocks)
	}
}

// TestDiscoveryLayoutChange: an engine redeployed with a smaller KV cache
// at run time. The steady trace's 50 rows, replayed again and again, each
// fill one 16-token block (their 4-token tails fill none): 4,096 blocks
// hold a pass and every row is a hit (16 tokens) from the second pass on;
// 10 blocks hold 5 rows and no row is ever a hit. The change is logged,
// counted and shown, and the model's hits follow it.
func TestDiscoveryLayoutChange(t *testing.T) {
	t.Parallel()
	emu := daemontest.StartEmulator(t, emulate.Config{Model: "m", BlockSize: 16, CapacityBlocks: 4096})
	var logs testutil.Buffer
	often := discoverySchedule{retry: 50 * time.Millisecond, retryMax: 50 * time.Millisecond, refresh: 50 * time.Millisecond, ignoreAnswers: true}
	d := discoveryDaemon(t, steadyConfig(t, emu.URL), often, &logs)
	read := func() (success, theoretical float64) {
		mfs := testutil.Gather(t, d.reg)
		success, _ = mfs.Value("kvload_requests_total", "outcome", "success")
		theoretical, _ = mfs.Value("kvload_theoretical_cached_prompt_tokens_total")
		return success, theoretical
	}
	testutil.Eventually(t, "hits in the model of 4,096 blocks", func() (bool, string) {
		n, theo := read()
		return theo >= 16*25, fmt.Sprintf("%v theoretical cached tokens in %v requests", theo, n)
	})

	resp, err := http.Post(emu.URL+"/emulator/cache", "application/json", strings.NewReader(`{"capacity_blocks": 10, "redeploy": true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("redeploy: %s", resp.Status)
	}
	testutil.Eventually(t, "the change seen", func() (bool, string) {
		mfs := testutil.Gather(t, d.reg)
		blocks, _ := mfs.Value("kvload_target_cache_capacity_blocks")
		changes, _ := mfs.Value("kvload_target_cache_layout_changes_total")
		return blocks == 10 && changes == 1, fmt.Sprintf("%v blocks, %v changes", blocks, changes)
	})
	if p := d.modelParams(t); p.CapacityBlocks != 10 {
		t.Errorf("the unit's model stands for %d blocks, want 10", p.CapacityBlocks)
	}
	if note := d.Status().Targets[0].CacheNote; !strings.Contains(note, "changed from 4096 blocks of 16 tokens to 10 blocks of 16 tokens at ") {
		t.Errorf("the landing page's note: %q", note)
	}
	if got := logs.String(); !strings.Contains(got, `old="4096 blocks of 16 tokens" new="10 blocks of 16 tokens"`) {
		t.Errorf("the change is not logged with its values:\n%s", got)
	}

	// Past the requests in flight at the change, more than a pass: the
	// model of 10 blocks finds no hit.
	n0, _ := read()
	var from float64
	testutil.Eventually(t, "requests after the change", func() (bool, string) {
		n, theo := read()
		from = theo
		return n >= n0+8, fmt.Sprint(n, " requests")
	})
	n1, _ := read()
	testutil.Eventually(t, "a pass modelled with 10 blocks", func() (bool, string) {
		n, theo := read()
		if theo != from {
			t.Fatalf("%v theoretical cached tokens in the %v requests after the change, want none", theo-from, n-n1)
		}
		return n >= n1+60, fmt.Sprint(n, " requests")
	})
}

// TestDiscoveryImplausibleLayout: a target that reports a KV cache no
// server has is modelled with its capacity unknown (unbounded), the read
// counted as a bad answer and a warning naming the target and the values.
// The model then counts the hits of tiny.jsonl's second row, which shares
// its first's three blocks. Taken as true, 2^62 blocks of 1,024 tokens
// and blocks of 2^31 tokens overflowed the model's bound on its entries,
// so that it evicted everything and counted no hit; 10^15 blocks made a
// model that never evicts, under loop: fresh too; an SGLang page larger
// than its pool made 0 blocks, an unbounded cache reported as known.
func TestDiscoveryImplausibleLayout(t *testing.T) {
	t.Parallel()
	vllm := func(blockSize, blocks string) string {
		return `vllm:cache_config_info{block_size="` + blockSize + `",num_gpu_blocks="` + blocks + `"} 1` + "\n"
	}
	for _, tt := range []struct {
		name    string
		dialect string
		layout  string // vLLM's /metrics, or SGLang's /get_server_info
		loop    string
		values  string // as the warning names them
	}{
		{"2^62 blocks of 1024", "vllm", vllm("1024", "4611686018427387904"), "once", "4611686018427387904 blocks of 1024 tokens"},
		{"blocks of 2^31 tokens", "vllm", vllm("2147483648", "4"), "once", "block size 2147483648"},
		{"10^15 blocks, fresh", "vllm", vllm("16", "1000000000000000"), "fresh", "1000000000000000 blocks of 16 tokens"},
		{"sglang page above the pool", "sglang", `{"max_total_num_tokens": 100, "page_size": 128}`, "once", "page_size 128 is above max_total_num_tokens 100"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := layoutServer(t, tt.dialect, tt.layout)
			cfg := daemontest.Config(srv.URL, fixture(t, "tiny.jsonl"))
			daemontest.SetString(&cfg.Targets[0].Dialect, tt.dialect)
			daemontest.SetString(&cfg.Workloads[0].Loop, tt.loop)
			var logs testutil.Buffer
			never := discoverySchedule{retry: time.Hour, retryMax: time.Hour, refresh: time.Hour, ignoreAnswers: true}
			d := discoveryDaemon(t, cfg, never, &logs)
			mfs := testutil.Gather(t, d.reg)
			if known, _ := mfs.Value("kvload_target_cache_capacity_known"); known != 0 {
				t.Errorf("capacity known %v, want 0 (unknown)", known)
			}
			if n, _ := mfs.Value("kvload_target_cache_discovery_failures_total", "reason", string(engine.LayoutBadAnswer)); n != 1 {
				t.Errorf("%v reads counted as bad answers, want 1", n)
			}
			if p := d.modelParams(t); p.CapacityBlocks != 0 {
				t.Errorf("the model holds %d blocks of %d tokens, want an unbounded model", p.CapacityBlocks, p.ServerBlock)
			}
			warn := `level=warn msg="the target reports a KV cache layout no server has`
			if log := logs.String(); !strings.Contains(log, warn) || !strings.Contains(log, "target=t ") || !strings.Contains(log, tt.values) {
				t.Errorf("no warning naming the target and %q:\n%s", tt.values, log)
			}
			testutil.Eventually(t, "the second row's hit modelled", func() (bool, string) {
				hits, _ := testutil.Gather(t, d.reg).Value("kvload_theoretical_cached_prompt_tokens_total")
				return hits > 0, fmt.Sprint(hits, " theoretical cached tokens")
			})
		})
	}
}

// layoutServer is a fake server of dialect (vllm or sglang) whose layout
// read answers layout; it answers requests as testutil.FakeServer does.
func layoutServer(t *testing.T, dialect, layout string) *httptest.Server {
	t.Helper()
	fake := testutil.NewFakeServer(t, nil)
	path := "/get_server_info"
	if dialect == string(engine.DialectVLLM) {
		path = "/metrics"
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == path {
			io.WriteString(w, layout)
			return
		}
		fake.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}
