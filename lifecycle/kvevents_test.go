package lifecycle

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/kvevents"
)

// TestKVEventsFollowed: an emulated engine that publishes its KV events is
// followed without a cache.kv_events of its own; a reload that drops them
// stops the stream and deletes its series, and the shutdown leaves no
// goroutine behind (goleak, in TestMain).
func TestKVEventsFollowed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	cfg := config.Config{
		Targets:   []config.Target{{Name: "emu", Emulate: &config.Emulate{KVEvents: "tcp://127.0.0.1:0"}}},
		Workloads: []config.Workload{daemontest.Workload("w", trace, "emu")},
	}
	daemontest.WriteConfig(t, path, cfg)
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	connected := func() (float64, int) {
		return testutil.Gather(t, d.reg).Value("kvload_kv_events_streams_connected", "target", "emu")
	}
	testutil.Eventually(t, "the emulated engine's stream followed", func() (bool, string) {
		v, n := connected()
		return n == 1 && v == 1, fmt.Sprint(v, n)
	})
	if f := d.kv.following["emu"]; f == nil || len(f.streams.Streams) != 1 || f.streams.Streams[0].Endpoint != d.emulators.running["emu"].engine.KVEventsEndpoint() {
		t.Fatalf("following %+v, want the emulator's own endpoint", f)
	}

	cfg.Targets[0].Emulate.KVEvents = ""
	daemontest.WriteConfig(t, path, cfg)
	if err := d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, n := connected(); n != 0 || len(d.kv.following) != 0 {
		t.Errorf("after the reload: %d connected series, %d targets followed; want none", n, len(d.kv.following))
	}
}

// TestKVReporterStreaks: a stream's problems are logged by the
// failure-streak rule, a line at once, then at most one every 30 s saying
// how many it left out, however many bad batches come; every one is
// counted. A jump of the sequence too long to be batches lost counts as
// a restart, not as a gap.
func TestKVReporterStreaks(t *testing.T) {
	type step struct {
		at   time.Duration // since the start
		n    int           // bad batches, one a millisecond
		jump uint64        // then one batch skipping this many; 0: none
	}
	tests := []struct {
		name     string
		steps    []step
		lines    []string // the log, its endpoint, level and error left out
		gaps     float64
		restarts float64
	}{
		{"15,001 bad batches in 15 s", []step{{0, 15_001, 0}}, []string{`"KV event message not taken" reason=decode`}, 0, 0},
		{"a streak over a minute", []step{{0, 10, 0}, {29 * time.Second, 10, 0}, {30 * time.Second, 10, 0}, {61 * time.Second, 1, 0}},
			[]string{`"KV event message not taken" reason=decode`, `"KV event message not taken" reason=decode lines_left_out=19`,
				`"KV event message not taken" reason=decode lines_left_out=9`}, 0, 0},
		{"a gap", []step{{0, 0, 7}}, []string{`"KV event batches lost: requests sent before now are not classified" batches=7`}, 7, 0},
		{"a jump of 2^62", []step{{0, 0, 1 << 62}}, []string{`"the engine's KV event sequence started again (went back, or jumped too far to be batches lost): a new engine, whose cache starts empty"`}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			reg := prometheus.NewRegistry()
			coll := collector.New(reg)
			coll.KVEvents().Start("emu", 1)
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := start
			r := newKVReporter(coll, "emu", log.NewLogfmtLogger(&buf))
			r.now = func() time.Time { return now }
			s := kvevents.NewStream("tcp://engine:5557")
			s.Connected(start)
			seq := uint64(0)
			s.Apply(t.Context(), seq, &kvevents.Batch{}, start)
			for _, st := range tt.steps {
				now = start.Add(st.at)
				for range st.n {
					r.Error(s, kvevents.ReasonDecode, 1, errors.New("batch: not an array"))
					now = now.Add(time.Millisecond)
				}
				if st.jump > 0 {
					seq += st.jump + 1
					r.Batch(s, s.Apply(t.Context(), seq, &kvevents.Batch{}, now))
				}
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				if l == "" {
					continue
				}
				l = strings.Join(strings.Fields(l)[1:], " ") // the level
				l = strings.TrimPrefix(l, "msg=")
				before, after, _ := strings.Cut(l, ` err="batch: not an array"`)
				l = before + after
				l = strings.ReplaceAll(l, " endpoint=tcp://engine:5557", "")
				got = append(got, l)
			}
			if strings.Join(got, "\n") != strings.Join(tt.lines, "\n") {
				t.Errorf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.lines, "\n"))
			}
			m := testutil.Gather(t, reg)
			decodes, gaps, restarts := m.Sum("kvload_kv_events_errors_total", "reason", "decode"),
				m.Sum("kvload_kv_events_errors_total", "reason", "gap"), m.Sum("kvload_kv_events_errors_total", "reason", "restart")
			want := 0
			for _, st := range tt.steps {
				want += st.n
			}
			if decodes != float64(want) || gaps != tt.gaps || restarts != tt.restarts {
				t.Errorf("counted %v decode errors, %v gaps, %v restarts; want %d, %v, %v", decodes, gaps, restarts, want, tt.gaps, tt.restarts)
			}
		})
	}
}
