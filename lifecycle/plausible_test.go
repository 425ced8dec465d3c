package lifecycle

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

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
