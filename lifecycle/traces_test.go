package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/synth"
)

// writeTrace writes rows rows, spaced gap ms apart, each with its own
// block ids from base.
func writeTrace(t *testing.T, path string, rows, gap, base int) {
	t.Helper()
	var b strings.Builder
	for i := range rows {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 20, "output_length": 1, "hash_ids": [%d, %d]}`+"\n", i*gap, base+2*i, base+2*i+1)
	}
	daemontest.WriteFile(t, path, b.String())
}

// sharedConfig: workloads a and b replay one file against two targets each;
// c, when given, another file.
func sharedConfig(srvURL, shared, other string, cInFlight int) config.Config {
	var cfg config.Config
	for _, n := range []string{"t1", "t2", "t3"} {
		cfg.Targets = append(cfg.Targets, daemontest.Target(n, srvURL+"/"+n))
	}
	fresh := func(name, trace string, inFlight int, targets ...string) config.Workload {
		w := daemontest.Workload(name, trace, targets...)
		w.Loop, w.MaxInFlight = "fresh", inFlight
		return w
	}
	b := fresh("b", shared, 32, "t1", "t2")
	b.Seed = 9
	cfg.Workloads = []config.Workload{fresh("a", shared, 64, "t1", "t2"), b}
	if other != "" {
		cfg.Workloads = append(cfg.Workloads, fresh("c", other, cInFlight, "t3"))
	}
	return cfg
}

// TestTraceParsedOnce: a file used by two workloads and four units is read
// once; reloads that add, change and remove a workload of another file
// read only that file, never the unchanged one; a file whose bytes change
// is read again and its units restart, one merely touched is not parsed
// into anything new.
func TestTraceParsedOnce(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	shared, other := filepath.Join(dir, "shared.jsonl"), filepath.Join(dir, "other.jsonl")
	// Rows an hour apart: each unit sends its first row and waits.
	writeTrace(t, shared, 3, 3600000, 0)
	writeTrace(t, other, 3, 3600000, 1000)
	daemontest.WriteConfig(t, path, sharedConfig(srv.URL, shared, "", 0))
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	stats := d.traces.stats // the same counters for every later cache
	parses := func() int64 { return stats.parses.Load() }
	if got := parses(); got != 1 {
		t.Fatalf("%d parses for one file used by 4 units, want 1", got)
	}
	a1 := d.units.byKey[unitKey{"a", "t1"}]
	if a1 == nil || len(d.units.byKey) != 4 {
		t.Fatalf("units %v", d.units.byKey)
	}
	if d.units.byKey[unitKey{"a", "t1"}].workload == nil {
		t.Fatal("no workload")
	}

	steps := []struct {
		what       string
		config     config.Config
		touch      func(t *testing.T) // before the reload
		wantParses int64
	}{
		{"add c", sharedConfig(srv.URL, shared, other, 8), nil, 2},
		{"change c", sharedConfig(srv.URL, shared, other, 4), nil, 2},
		{"remove c", sharedConfig(srv.URL, shared, "", 0), nil, 2},
		{"touch the shared file", sharedConfig(srv.URL, shared, "", 0), func(t *testing.T) {
			now := time.Now().Add(time.Minute)
			if err := os.Chtimes(shared, now, now); err != nil {
				t.Fatal(err)
			}
		}, 3},
	}
	for _, st := range steps {
		if st.touch != nil {
			st.touch(t)
		}
		daemontest.WriteConfig(t, path, st.config)
		if err := d.Reload(ctx); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if got := parses(); got != st.wantParses {
			t.Errorf("%s: %d parses in all, want %d", st.what, got, st.wantParses)
		}
		if d.units.byKey[unitKey{"a", "t1"}] != a1 {
			t.Errorf("%s: the unit of an unchanged workload was replaced", st.what)
		}
		// All workloads of one file and knobs share one plan.
		if p1, p2 := d.units.byKey[unitKey{"a", "t1"}].plan, d.units.byKey[unitKey{"b", "t2"}].plan; p1 != p2 {
			t.Errorf("%s: workloads a and b hold two copies of one trace", st.what)
		}
	}

	// Changed bytes: read again, and the units of the file start over.
	writeTrace(t, shared, 4, 3600000, 0)
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := parses(); got != 4 {
		t.Errorf("after the file changed: %d parses in all, want 4", got)
	}
	if d.units.byKey[unitKey{"a", "t1"}] == a1 {
		t.Error("the units of a changed trace kept running on the old rows")
	}
}

// TestTracePlanSynthesisCompact: a workload with synthesis options is
// planned from its trace's table, never from rows unpacked into Records:
// what planning allocates does not grow with the rows. (Not parallel:
// allocations are counted for the whole process.)
func TestTracePlanSynthesisCompact(t *testing.T) {
	const rows = 20000
	path := filepath.Join(t.TempDir(), "t.jsonl")
	writeTrace(t, path, rows, 10, 0)
	w := daemontest.Workload("w", path, "t")
	ctx := t.Context()
	with := func(f func(*synth.Knobs)) synth.Knobs {
		k := synth.DefaultKnobs()
		k.BlockSize, k.Seed = w.BlockSize, 5
		f(&k)
		return k
	}
	read := newTraceCache() // holds the parsed file, and the plan of no synthesis
	if _, err := read.plan(ctx, newTraceCache(), path, &w, with(func(*synth.Knobs) {})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		k    synth.Knobs
	}{
		{"speedup_ratio", with(func(k *synth.Knobs) { k.SpeedupRatio = 147 })},
		{"speedup_ratio max_osl", with(func(k *synth.Knobs) { k.SpeedupRatio = 147; k.MaxOSL = 16 })},
		{"prefix multipliers", with(func(k *synth.Knobs) { k.PrefixLenMultiplier = 2; k.PrefixRootMultiplier = 3 })},
		{"output_len_multiplier", with(func(k *synth.Knobs) { k.OutputLenMultiplier = 3 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var plan *tracePlan
			allocs := testing.AllocsPerRun(2, func() {
				var err error
				if plan, err = read.next().plan(ctx, read, path, &w, tc.k); err != nil {
					t.Fatal(err)
				}
			})
			if plan.file != read.files[fileKey{path, w.BlockSize}] {
				t.Fatal("the file was read again")
			}
			if perRow := allocs / rows; perRow > 0.01 {
				t.Errorf("%.0f allocations to plan %d rows (%.3f a row), want none per row", allocs, rows, perRow)
			}
		})
	}
}

// TestTraceRowsLetGo: a file whose plans all have rows of their own (from
// synthesis) keeps none of its own between loads. A later load that needs
// them for a new plan reads the file again; one that reuses its plans
// reads nothing; a plan that replays the rows as they are keeps them.
func TestTraceRowsLetGo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.jsonl")
	writeTrace(t, path, 100, 10, 0)
	w := daemontest.Workload("w", path, "t")
	fk := fileKey{path, w.BlockSize}
	ctx := t.Context()
	prev := newTraceCache()
	// load is one (re)load with a workload of the file per speed-up.
	load := func(speedups []float64) *traceCache {
		t.Helper()
		c := prev.next()
		for _, s := range speedups {
			k := synth.DefaultKnobs()
			k.BlockSize, k.SpeedupRatio = w.BlockSize, s
			if _, err := c.plan(ctx, prev, path, &w, k); err != nil {
				t.Fatal(err)
			}
		}
		c.letGoOfUnusedRows()
		prev = c
		return c
	}
	for _, st := range []struct {
		what       string
		speedups   []float64
		wantParses int64
		wantRows   bool
	}{
		{"synthesized", []float64{2}, 1, false},
		{"the same again", []float64{2}, 1, false},
		{"another speed-up beside it", []float64{2, 3}, 2, false},
		{"the rows as they are beside it", []float64{2, 1}, 3, true},
		{"the rows as they are alone", []float64{1}, 3, true},
		{"synthesized again", []float64{4}, 3, false},
	} {
		c := load(st.speedups)
		if got := c.stats.parses.Load(); got != st.wantParses {
			t.Errorf("%s: %d parses in all, want %d", st.what, got, st.wantParses)
		}
		if got := c.files[fk].rows != nil; got != st.wantRows {
			t.Errorf("%s: the file's own rows held: %v, want %v", st.what, got, st.wantRows)
		}
		for pk, tp := range c.plans {
			if n := tp.plan.Rows().Len(); n != 100 {
				t.Errorf("%s: the plan of %+v has %d rows, want 100", st.what, pk.knobs, n)
			}
		}
	}
}

// TestGeneratedRowsLetGo: a workload that generates its rows, with a
// synthesis setting, lets its generated rows go like a file's; a reload
// with a new setting generates them again, where it once tried to read
// the generator's name as a file.
func TestGeneratedRowsLetGo(t *testing.T) {
	t.Parallel()
	w := daemontest.Workload("w", "", "t")
	w.Trace = ""
	w.Generate = &config.Generate{SharedPrefix: synth.SharedPrefix{Prefixes: 4, PrefixTokens: 1024, Requests: 50,
		InputTokens: config.TokenLengths{Mean: 600, StdDev: 50}, OutputTokens: config.TokenLengths{Mean: 8}, Rate: 5}}
	path := generatedName(w.SharedPrefix())
	ctx := t.Context()
	prev := newTraceCache()
	for _, speedup := range []float64{2, 3} {
		c := prev.next()
		k := synth.DefaultKnobs()
		k.BlockSize, k.SpeedupRatio = w.BlockSize, speedup
		tp, err := c.plan(ctx, prev, path, &w, k)
		if err != nil {
			t.Fatalf("speed-up %v: %v", speedup, err)
		}
		if n := tp.plan.Rows().Len(); n != 50 {
			t.Errorf("speed-up %v: %d rows, want 50", speedup, n)
		}
		c.letGoOfUnusedRows()
		prev = c
	}
}

// TestReloadLeavesNeighbourAlone: while a workload replays a row every few
// milliseconds, reloads add, change and remove another workload next to
// it. The busy one keeps its unit and its schedule: it drops nothing, and
// its rows keep going out, in order, across the reloads.
func TestReloadLeavesNeighbourAlone(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	busy, small := filepath.Join(dir, "busy.jsonl"), filepath.Join(dir, "small.jsonl")
	writeTrace(t, busy, 500, 4, 0) // 2 s a pass, looping
	writeTrace(t, small, 3, 3600000, 5000)
	configure := func(small string, inFlight int) config.Config {
		cfg := config.Config{Targets: []config.Target{daemontest.Target("tb", srv.URL+"/tb"), daemontest.Target("ts", srv.URL+"/ts")}}
		bw := daemontest.Workload("busy", busy, "tb")
		// Queue, not drop: only a stop or a stall of a minute could drop a row.
		bw.Loop, bw.MaxInFlight, bw.OnSaturation = "fresh", 1000, "queue"
		cfg.Workloads = append(cfg.Workloads, bw)
		if small != "" {
			w := daemontest.Workload("small", small, "ts")
			w.MaxInFlight = inFlight
			cfg.Workloads = append(cfg.Workloads, w)
		}
		return cfg
	}
	daemontest.WriteConfig(t, path, configure("", 0))
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const busyPath = "/tb/v1/chat/completions"
	testutil.Eventually(t, "the busy workload under way", func() (bool, string) {
		n := srv.Count(busyPath)
		return n >= 20, fmt.Sprintf("%d requests", n)
	})
	busyUnit := d.units.byKey[unitKey{"busy", "tb"}]
	for _, st := range []struct {
		what   string
		config config.Config
	}{
		{"add", configure(small, 8)},
		{"change", configure(small, 4)},
		{"remove", configure("", 0)},
	} {
		before, smallBefore := srv.Count(busyPath), srv.Count("/ts/v1/chat/completions")
		daemontest.WriteConfig(t, path, st.config)
		if err := d.Reload(ctx); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if st.what != "remove" {
			testutil.Eventually(t, st.what+": the small workload's first request", func() (bool, string) {
				n := srv.Count("/ts/v1/chat/completions")
				return n > smallBefore, fmt.Sprintf("%d requests, %d before the reload", n, smallBefore)
			})
		}
		if d.units.byKey[unitKey{"busy", "tb"}] != busyUnit {
			t.Fatalf("%s: the busy workload's unit was replaced", st.what)
		}
		testutil.Eventually(t, st.what+": the busy workload going on", func() (bool, string) {
			n := srv.Count(busyPath)
			return n >= before+20, fmt.Sprintf("%d requests, %d before the reload", n, before)
		})
	}
	mfs := testutil.Gather(t, d.reg)
	if v, _ := mfs.Value("kvload_requests_dropped_total", "workload", "busy"); v != 0 {
		t.Errorf("the busy workload dropped %v rows across the reloads, want 0", v)
	}
	sent, _ := mfs.Value("kvload_schedule_lag_seconds", "workload", "busy")
	if sent < 80 {
		t.Errorf("%v rows sent by the busy workload, want at least 80", sent)
	}
}
