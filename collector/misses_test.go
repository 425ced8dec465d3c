package collector

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/kvevents"
)

// TestKVEvents: a target's stream series and a pair's miss series exist at
// zero once started, count what the streams and the classifier report,
// and all go when the target follows no stream any more; Forget of the
// pair takes only the pair's.
func TestKVEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	kv := c.KVEvents()
	kv.Start("t", 2)
	kv.StartMissedHits("w", "t")
	m := testutil.Gather(t, reg)
	for _, want := range []struct {
		name   string
		series int
		value  float64
	}{
		{"kvload_cache_missed_hit_tokens_total", len(kvevents.Classes), 0},
		{"kvload_cache_missed_hit_unclassified_requests_total", len(kvevents.UnclassifiedReasons), 0},
		{"kvload_kv_events_errors_total", len(kvevents.ErrorReasons), 0},
		{"kvload_kv_events_batches_total", 1, 0},
		{"kvload_kv_events_streams", 1, 2},
		{"kvload_kv_events_streams_connected", 1, 0},
	} {
		if v, n := m.Value(want.name, "target", "t"); v != want.value || n != want.series {
			t.Errorf("%s: %v over %d series, want %v over %d", want.name, v, n, want.value, want.series)
		}
	}
	kv.MissedHitTokens("w", "t", kvevents.ClassEvicted, 48)
	kv.MissedHitUnclassified("w", "t", kvevents.UnclassifiedTokenize)
	kv.Error("t", kvevents.ReasonGap, 3)
	kv.Batch("t")
	kv.Connected("t", 1)
	kv.Connected("t", 1)
	kv.Connected("t", -1)
	m = testutil.Gather(t, reg)
	for _, want := range []struct {
		name  string
		pairs []string
		value float64
	}{
		{"kvload_cache_missed_hit_tokens_total", []string{"class", "evicted"}, 48},
		{"kvload_cache_missed_hit_unclassified_requests_total", []string{"reason", "tokenize"}, 1},
		{"kvload_kv_events_errors_total", []string{"reason", "gap"}, 3},
		{"kvload_kv_events_batches_total", nil, 1},
		{"kvload_kv_events_streams_connected", nil, 1},
	} {
		if v, _ := m.Value(want.name, append([]string{"target", "t"}, want.pairs...)...); v != want.value {
			t.Errorf("%s %v: %v, want %v", want.name, want.pairs, v, want.value)
		}
	}
	c.Forget("w", "t")
	if _, n := testutil.Gather(t, reg).Value("kvload_cache_missed_hit_tokens_total", "target", "t"); n != 0 {
		t.Errorf("%d miss series after Forget of the pair", n)
	}
	if _, n := testutil.Gather(t, reg).Value("kvload_kv_events_streams", "target", "t"); n != 1 {
		t.Errorf("the target's stream series went with the pair")
	}
	kv.Stop("t")
	if left := testutil.Gather(t, reg).SeriesWith("target", "t"); len(left) != 0 {
		t.Errorf("left after Stop: %v", left)
	}
}
