package lifecycle

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// saltRecorder stands in front of a fake vLLM and records the cache salt
// of every completion request: "-" for a body without one.
type saltRecorder struct {
	url   string
	mu    sync.Mutex
	salts []string
}

func newSaltRecorder(t *testing.T) *saltRecorder {
	t.Helper()
	fake := newFakeServer(t, nil)
	r := &saltRecorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/completions") {
			body, _ := io.ReadAll(req.Body)
			var fields map[string]json.RawMessage
			salt := "unparsable"
			if json.Unmarshal(body, &fields) == nil {
				salt = "-"
				if raw, ok := fields["cache_salt"]; ok {
					_ = json.Unmarshal(raw, &salt)
				}
			}
			r.mu.Lock()
			r.salts = append(r.salts, salt)
			r.mu.Unlock()
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		fake.Config.Handler.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// seen is the salts recorded, each once, in the order first seen.
func (r *saltRecorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.salts {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func (r *saltRecorder) requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.salts)
}

// isolationConfig writes a configuration of target t (at url, with cache)
// and, when second is set, a target u at the same url, replayed once by
// workloads w and x, two rows each.
func isolationConfig(t *testing.T, url string, cache config.Cache, second bool) string {
	t.Helper()
	dir := t.TempDir()
	trace := filepath.Join(dir, "now.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 3]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	target := daemontest.Target("t", url)
	target.Cache = cache
	cfg := config.Config{Targets: []config.Target{target},
		Workloads: []config.Workload{daemontest.Workload("w", trace, "t"), daemontest.Workload("x", trace, "t")}}
	if second {
		u := target
		u.Name = "u"
		cfg.Targets = append(cfg.Targets, u)
		for i := range cfg.Workloads {
			cfg.Workloads[i].Targets = append(cfg.Workloads[i].Targets, "u")
		}
	}
	path := filepath.Join(dir, "kvload.yml")
	daemontest.WriteConfig(t, path, cfg)
	return path
}

// runSalts starts a daemon on a configuration of cache, sending to a
// recorder of its own, and returns the salts its requests carried once
// want requests arrived.
func runSalts(t *testing.T, cache config.Cache, second bool, want int, opts func(*Options)) []string {
	t.Helper()
	r := newSaltRecorder(t)
	d, err := startDaemon(t, isolationConfig(t, r.url, cache, second), opts)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "every request sent", func() (bool, string) {
		return r.requests() >= want, strings.Join(r.seen(), ",")
	})
	d.stop()
	testutil.Wait(t, "the daemon stopped", d.Done())
	return r.seen()
}

var saltPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

// TestIsolationSalts: with cache.isolate every request carries a salt of
// its (workload, target): the two workloads, and two targets on one
// engine, each have their own. Two daemons of the same configuration (two
// processes, or a process and its restart) draw different salts; with an
// isolation_epoch they build the same ones. Without isolate no request
// carries a salt.
func TestIsolationSalts(t *testing.T) {
	t.Parallel()
	isolate := config.Cache{Isolate: true}
	a, b := runSalts(t, isolate, true, 8, nil), runSalts(t, isolate, true, 8, nil)
	for _, salts := range [][]string{a, b} {
		if len(salts) != 4 {
			t.Fatalf("salts %q: want one for each of 2 workloads × 2 targets", salts)
		}
		for _, s := range salts {
			if !saltPattern.MatchString(s) {
				t.Errorf("salt %q: want 16 hex digits", s)
			}
		}
	}
	for _, s := range a {
		if slices.Contains(b, s) {
			t.Errorf("two daemons of the same configuration share salt %s: %q and %q", s, a, b)
		}
	}

	fleet := config.Cache{Isolate: true, IsolationEpoch: "fleet-a"}
	c, d := runSalts(t, fleet, false, 4, nil), runSalts(t, fleet, false, 4, nil)
	slices.Sort(c)
	slices.Sort(d)
	want := []string{cacheSalt("fleet-a", "w", "t"), cacheSalt("fleet-a", "x", "t")}
	slices.Sort(want)
	if !slices.Equal(c, want) || !slices.Equal(d, want) {
		t.Errorf("with isolation_epoch: salts %q and %q, want both %q", c, d, want)
	}

	if none := runSalts(t, config.Cache{}, false, 4, nil); !slices.Equal(none, []string{"-"}) {
		t.Errorf("without isolate: salts %q, want none sent", none)
	}
}

// TestIsolationRefused: a daemon does not start with isolation where the
// dialect takes no salt, nor as one of several replicas (--shard) of a
// target that isolates without an isolation_epoch; with one it does.
func TestIsolationRefused(t *testing.T) {
	t.Parallel()
	r := newSaltRecorder(t)
	llama := isolationConfig(t, r.url, config.Cache{Isolate: true}, false)
	data, err := os.ReadFile(llama)
	if err != nil {
		t.Fatal(err)
	}
	daemontest.WriteFile(t, llama, strings.ReplaceAll(string(data), "dialect: vllm", "dialect: llamacpp"))
	if _, err := startDaemon(t, llama, nil); err == nil || !strings.Contains(err.Error(), "targets[0].cache.isolate: dialect llamacpp takes no cache salt") {
		t.Errorf("llamacpp with isolate: %v, want refused", err)
	}
	shard := func(o *Options) { o.Shard = &config.Shard{Index: 1, Count: 2} }
	if _, err := startDaemon(t, isolationConfig(t, r.url, config.Cache{Isolate: true}, false), shard); err == nil ||
		!strings.Contains(err.Error(), "targets[0].cache.isolate: with --shard the 2 replicas build the same prompts and must share a cache salt") {
		t.Errorf("--shard=1/2 with isolate and no epoch: %v, want refused", err)
	}
	// Its share is one row of each workload's two.
	if salts := runSalts(t, config.Cache{Isolate: true, IsolationEpoch: "fleet"}, false, 2, shard); len(salts) != 2 {
		t.Errorf("--shard=1/2 with an epoch: salts %q, want one per workload", salts)
	}
	if r.requests() != 0 {
		t.Errorf("a refused daemon sent %d requests", r.requests())
	}
}
