package lifecycle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// reloadConfig is the configuration of the direct reload test: three
// workloads on three targets (paths of one server), each replaying
// future.jsonl: two rows at once, the third an hour later, so every
// workload stands at position {0 2} for the whole test.
func reloadConfig(srvURL, trace string, changeInFlight int, withRemove bool) config.Config {
	names := []string{"keep", "change"}
	if withRemove {
		names = append(names, "remove")
	}
	cfg := twoWorkloads(srvURL, trace, names...)
	for i := range cfg.Workloads {
		cfg.Workloads[i].MaxInFlight = 8
		if cfg.Workloads[i].Name == "change" {
			cfg.Workloads[i].MaxInFlight = changeInFlight
		}
	}
	return cfg
}

// TestReloadUnits reloads a real file through the owner goroutine and looks at the units themselves:
// (a) an unchanged workload keeps its unit, trace position and counters;
// (b) a changed one restarts from the start with fresh series;
// (c) a removed one's series are gone;
// (d) an invalid file changes nothing but the reload gauge.
func TestReloadUnits(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	trace := fixture(t, "future.jsonl")
	ctx := t.Context()
	daemontest.WriteConfig(t, path, reloadConfig(srv.URL, trace, 8, true))
	d, err := startDaemon(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := d.reg
	successes := func(w string) float64 {
		v, _ := testutil.Gather(t, reg).Value("kvload_requests_total", "workload", w, "outcome", "success")
		return v
	}
	testutil.Eventually(t, "the first two rows of every workload done", func() (bool, string) {
		k, c, r := successes("keep"), successes("change"), successes("remove")
		return k == 2 && c == 2 && r == 2, fmt.Sprintf("keep %v, change %v, remove %v", k, c, r)
	})
	keepKey, changeKey := unitKey{"keep", "t-keep"}, unitKey{"change", "t-change"}
	keep, change := d.units[keepKey], d.units[changeKey]
	wantPos := replay.TracePosition{Pass: 0, Conv: 2}
	for _, u := range []*unit{keep, change} {
		if got := u.workload.Position(); got != wantPos {
			t.Fatalf("position before the reload %+v, want %+v", got, wantPos)
		}
	}

	// (d) An invalid file: nothing changes but the gauge.
	invalid := reloadConfig(srv.URL, trace, 8, true)
	invalid.Workloads[0].Targets = []string{"t-nope"}
	daemontest.WriteConfig(t, path, invalid)
	if err := d.Reload(ctx); err == nil || !strings.Contains(err.Error(), `unknown target "t-nope"`) {
		t.Fatalf("reload of an invalid file: %v", err)
	}
	mfs := testutil.Gather(t, reg)
	if v, _ := mfs.Value("kvload_config_last_reload_successful"); v != 0 {
		t.Errorf("kvload_config_last_reload_successful %v after a bad reload, want 0", v)
	}
	if len(d.units) != 3 || d.units[keepKey] != keep || d.units[changeKey] != change {
		t.Errorf("a rejected file changed the units: %v", d.units)
	}
	if v, _ := mfs.Value("kvload_requests_total", "workload", "remove"); v != 2 {
		t.Errorf("a rejected file reset the counters: remove has %v requests, want 2", v)
	}

	// Change "change", drop "remove", leave "keep" alone.
	daemontest.WriteConfig(t, path, reloadConfig(srv.URL, trace, 4, false))
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}

	// (a) kept: the same unit, still at its position, counters intact.
	if got := d.units[keepKey]; got != keep {
		t.Errorf("unchanged workload got a new unit (%p, was %p)", got, keep)
	} else if got.workload != keep.workload {
		t.Errorf("unchanged workload got a new replay.Workload")
	}
	if got := keep.workload.Position(); got != wantPos {
		t.Errorf("unchanged workload's position %+v, want %+v", got, wantPos)
	}
	if v := successes("keep"); v != 2 {
		t.Errorf("unchanged workload's requests %v after the reload, want 2 (not reset)", v)
	}

	// (b) changed: a new unit replaying from the start, counted afresh.
	if got := d.units[changeKey]; got == nil || got == change || got.workload == change.workload {
		t.Fatalf("changed workload kept its unit")
	}
	testutil.Eventually(t, "the changed workload replayed again from the start", func() (bool, string) {
		return srv.Count("/change/v1/chat/completions") == 4 && successes("change") == 2,
			fmt.Sprintf("server saw %d, counted %v", srv.Count("/change/v1/chat/completions"), successes("change"))
	})
	if got := d.units[changeKey].workload.Position(); got != wantPos {
		t.Errorf("restarted workload's position %+v, want %+v", got, wantPos)
	}
	if got := srv.Count("/keep/v1/chat/completions"); got != 2 {
		t.Errorf("unchanged workload sent %d requests in all, want 2 (it must not start over)", got)
	}

	// (c) removed: no series left with its workload or target label.
	mfs = testutil.Gather(t, reg)
	if s := append(mfs.SeriesWith("workload", "remove"), mfs.SeriesWith("target", "t-remove")...); len(s) > 0 {
		t.Errorf("series of the removed workload remain: %v", s)
	}
	if _, ok := d.units[unitKey{"remove", "t-remove"}]; ok || len(d.units) != 2 {
		t.Errorf("units after the reload: %v", d.units)
	}
	if v, _ := mfs.Value("kvload_config_last_reload_successful"); v != 1 {
		t.Errorf("kvload_config_last_reload_successful %v, want 1", v)
	}
}

// TestSendsTokenIDs: a target with prompt_format: token_ids gets its
// prompts as token ids, as many as the trace's input_length (a regression:
// the daemon used to build the token-id builder and send text anyway).
func TestSendsTokenIDs(t *testing.T) {
	t.Parallel()
	prompts := make(chan json.RawMessage, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt json.RawMessage `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		select {
		case prompts <- req.Prompt:
		default:
		}
		http.Error(w, `{"error":{"message":"not here"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "kvload.yml")
	cfg := config.Config{
		Targets:   []config.Target{{Name: "ids", URL: srv.URL, Model: "m", API: "completions", PromptFormat: "token_ids"}},
		Workloads: []config.Workload{daemontest.Workload("w", fixture(t, "future.jsonl"), "ids")},
	}
	daemontest.WriteConfig(t, path, cfg)
	if _, err := startDaemon(t, path, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var ids []int
		p := testutil.Wait(t, "a request", prompts)
		if err := json.Unmarshal(p, &ids); err != nil {
			t.Fatalf("prompt %.80s…: not a list of token ids: %v", p, err)
		}
		if len(ids) != 20 {
			t.Errorf("%d token ids, want the trace's input_length 20", len(ids))
		}
	}
}
