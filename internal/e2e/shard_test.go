package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/emulate"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// TestShippingShards starts three exporters in this process, shards 0/3,
// 1/3 and 2/3 of the same configuration (--shard), replaying a 60-row trace
// of single requests and multi-turn sessions once against ONE emulated
// engine. Between them they must send every row exactly once: the engine
// counts 60 successes, sees 60 distinct prompts each once, and the
// replicas' kvload_requests_total add up to 60, each replica sending its
// share.
func TestShippingShards(t *testing.T) {
	const replicas, sessions, turns, singles = 3, 6, 5, 30
	const rows = sessions*turns + singles

	ecfg := emulate.DefaultConfig()
	ecfg.Overhead, ecfg.PrefillPerToken, ecfg.InterToken = time.Microsecond, time.Nanosecond, time.Microsecond
	eng, err := emulate.New(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	prompts := map[string]int{} // the messages of every generation request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var req struct {
				Messages json.RawMessage `json:"messages"`
			}
			if json.Unmarshal(body, &req) == nil {
				mu.Lock()
				prompts[string(req.Messages)]++
				mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		eng.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	// 30 single requests and 6 sessions of 5 turns: 36 conversations, 12
	// per replica; every row has a hash id of its own, so its prompt is
	// unique.
	var trace bytes.Buffer
	hash := 1000
	for i := range singles {
		fmt.Fprintf(&trace, `{"timestamp": %d, "input_length": 24, "output_length": 4, "hash_ids": [1, %d]}`+"\n", i*3, hash)
		hash++
	}
	for turn := range turns {
		for s := range sessions {
			ts := ""
			if turn == 0 {
				ts = fmt.Sprintf(`"timestamp": %d, `, s*7)
			}
			ids := []string{"2"}
			for k := 0; k <= turn; k++ {
				ids = append(ids, strconv.Itoa(100*(s+1)+k))
			}
			ids = append(ids, strconv.Itoa(hash))
			hash++
			fmt.Fprintf(&trace, `{"session_id": "s%d", %s"input_length": %d, "output_length": 3, "hash_ids": [%s]}`+"\n",
				s, ts, 16*len(ids)-4, strings.Join(ids, ", "))
		}
	}
	w := daemontest.Workload("sharded", "trace.jsonl", "engine")
	w.Seed, w.Synthesis.SpeedupRatio = 7, 2
	cfg := config.Config{
		Targets:   []config.Target{{Name: "engine", URL: srv.URL, Model: ecfg.Model, Cache: config.Cache{BlockSize: config.Fixed(emulate.DefaultBlockSize)}}},
		Workloads: []config.Workload{w},
	}
	dir := e2eDir(t, map[string][]byte{"kvload.yml": daemontest.Marshal(t, cfg), "trace.jsonl": trace.Bytes()})

	ds := make([]*e2eDaemon, replicas)
	for i := range replicas {
		ds[i] = e2eStartFlags(t, filepath.Join(dir, "kvload.yml"), []string{fmt.Sprintf("--shard=%d/%d", i, replicas)})
	}
	var per []e2eTotals
	testutil.Eventually(t, "every replica has replayed its share once", func() (bool, string) {
		var seen []e2eTotals
		done := true
		for _, d := range ds {
			m := testutil.Scrape(t, d.base)
			tt := e2eTotalsOf(m, "engine", "sharded")
			seen = append(seen, tt)
			done = done && m.Sum("kvload_trace_loops_total", "workload", "sharded") >= 1 && tt.InFlight == 0
		}
		settled := done && fmt.Sprint(seen) == fmt.Sprint(per)
		per = seen
		return settled, fmt.Sprintf("per replica %+v", seen)
	})

	var sent, success float64
	for i, tt := range per {
		sent += tt.Finished + tt.Dropped
		success += tt.Success
		if tt.Finished == 0 || tt.Dropped != 0 || tt.Success != tt.Finished {
			t.Errorf("replica %d: %+v: want its share sent, all successful, none dropped", i, tt)
		}
	}
	s := eng.Stats()
	if success != rows || sent != rows || s.Success != rows {
		t.Errorf("replicas sent %v rows (%v successful), the engine counted %d successes; the trace has %d rows", sent, success, s.Success, rows)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(prompts) != rows {
		t.Errorf("the engine saw %d distinct prompts, the trace has %d rows", len(prompts), rows)
	}
	for p, n := range prompts {
		if n != 1 {
			t.Errorf("a prompt was sent %d times: %.80s...", n, p)
		}
	}
	t.Logf("%d rows; per replica %v/%v/%v requests; engine: %d successes, %d distinct prompts",
		rows, per[0].Finished, per[1].Finished, per[2].Finished, s.Success, len(prompts))
}
