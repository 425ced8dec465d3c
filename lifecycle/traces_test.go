package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTrace writes rows rows, spaced gap ms apart, each with its own
// block ids from base.
func writeTrace(t *testing.T, path string, rows, gap, base int) {
	t.Helper()
	var b strings.Builder
	for i := range rows {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 20, "output_length": 1, "hash_ids": [%d, %d]}`+"\n", i*gap, base+2*i, base+2*i+1)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sharedConfig: workloads a and b replay one file against two targets each;
// c, when given, another file.
func sharedConfig(srvURL, shared, other string, cInFlight int) string {
	var b strings.Builder
	b.WriteString("targets:\n")
	for _, n := range []string{"t1", "t2", "t3"} {
		fmt.Fprintf(&b, "  - {name: %s, url: %s/%s, model: m, dialect: vllm}\n", n, srvURL, n)
	}
	b.WriteString("workloads:\n")
	fmt.Fprintf(&b, "  - {name: a, trace: %s, targets: [t1, t2], block_size: 16, loop: fresh, max_in_flight: 64}\n", shared)
	fmt.Fprintf(&b, "  - {name: b, trace: %s, targets: [t1, t2], block_size: 16, loop: fresh, max_in_flight: 32, seed: 9}\n", shared)
	if other != "" {
		fmt.Fprintf(&b, "  - {name: c, trace: %s, targets: [t3], block_size: 16, loop: fresh, max_in_flight: %d}\n", other, cInFlight)
	}
	return b.String()
}

// TestTraceParsedOnce: a file used by two workloads and four units is read
// once; reloads that add, change and remove a workload of another file
// read only that file, never the unchanged one; a file whose bytes change
// is read again and its units restart, one merely touched is not parsed
// into anything new.
func TestTraceParsedOnce(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	shared, other := filepath.Join(dir, "shared.jsonl"), filepath.Join(dir, "other.jsonl")
	// Rows an hour apart: each unit sends its first row and waits.
	writeTrace(t, shared, 3, 3600000, 0)
	writeTrace(t, other, 3, 3600000, 1000)
	writeConfig(t, path, sharedConfig(srv.URL, shared, "", 0))
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
	a1 := d.units[unitKey{"a", "t1"}]
	if a1 == nil || len(d.units) != 4 {
		t.Fatalf("units %v", d.units)
	}
	if d.units[unitKey{"a", "t1"}].workload == nil {
		t.Fatal("no workload")
	}

	steps := []struct {
		what       string
		config     string
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
		writeConfig(t, path, st.config)
		if err := d.Reload(ctx); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if got := parses(); got != st.wantParses {
			t.Errorf("%s: %d parses in all, want %d", st.what, got, st.wantParses)
		}
		if d.units[unitKey{"a", "t1"}] != a1 {
			t.Errorf("%s: the unit of an unchanged workload was replaced", st.what)
		}
		// All workloads of one file and knobs share one plan.
		if p1, p2 := d.units[unitKey{"a", "t1"}].plan, d.units[unitKey{"b", "t2"}].plan; p1 != p2 {
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
	if d.units[unitKey{"a", "t1"}] == a1 {
		t.Error("the units of a changed trace kept running on the old rows")
	}
}

// TestReloadLeavesNeighbourAlone: while a workload replays a row every few
// milliseconds, reloads add, change and remove another workload next to
// it. The busy one keeps its unit and its schedule: it drops nothing, and
// its rows keep going out, in order, across the reloads.
func TestReloadLeavesNeighbourAlone(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	busy, small := filepath.Join(dir, "busy.jsonl"), filepath.Join(dir, "small.jsonl")
	writeTrace(t, busy, 500, 4, 0) // 2 s a pass, looping
	writeTrace(t, small, 3, 3600000, 5000)
	config := func(small string, inFlight int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "targets:\n  - {name: tb, url: %s/tb, model: m, dialect: vllm}\n  - {name: ts, url: %s/ts, model: m, dialect: vllm}\n", srv.URL, srv.URL)
		// Queue, not drop: only a stop or a stall of a minute could drop a row.
		fmt.Fprintf(&b, "workloads:\n  - {name: busy, trace: %s, targets: [tb], block_size: 16, loop: fresh, max_in_flight: 1000, on_saturation: queue}\n", busy)
		if small != "" {
			fmt.Fprintf(&b, "  - {name: small, trace: %s, targets: [ts], block_size: 16, loop: once, max_in_flight: %d}\n", small, inFlight)
		}
		return b.String()
	}
	writeConfig(t, path, config("", 0))
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const busyPath = "/tb/v1/chat/completions"
	eventually(t, "the busy workload under way", func() (bool, string) {
		n := srv.count(busyPath)
		return n >= 20, fmt.Sprintf("%d requests", n)
	})
	busyUnit := d.units[unitKey{"busy", "tb"}]
	for _, st := range []struct {
		what   string
		config string
	}{
		{"add", config(small, 8)},
		{"change", config(small, 4)},
		{"remove", config("", 0)},
	} {
		before, smallBefore := srv.count(busyPath), srv.count("/ts/v1/chat/completions")
		writeConfig(t, path, st.config)
		if err := d.Reload(ctx); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if st.what != "remove" {
			eventually(t, st.what+": the small workload's first request", func() (bool, string) {
				n := srv.count("/ts/v1/chat/completions")
				return n > smallBefore, fmt.Sprintf("%d requests, %d before the reload", n, smallBefore)
			})
		}
		if d.units[unitKey{"busy", "tb"}] != busyUnit {
			t.Fatalf("%s: the busy workload's unit was replaced", st.what)
		}
		eventually(t, st.what+": the busy workload going on", func() (bool, string) {
			n := srv.count(busyPath)
			return n >= before+20, fmt.Sprintf("%d requests, %d before the reload", n, before)
		})
	}
	mfs := gatherFamilies(t, d.reg)
	if v, _ := mfs.value("kvload_requests_dropped_total", "workload", "busy"); v != 0 {
		t.Errorf("the busy workload dropped %v rows across the reloads, want 0", v)
	}
	sent, _ := mfs.value("kvload_schedule_lag_seconds", "workload", "busy")
	if sent < 80 {
		t.Errorf("%v rows sent by the busy workload, want at least 80", sent)
	}
}
