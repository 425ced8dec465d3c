package replay

import (
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/openai"
)

func TestAbandonmentPicks(t *testing.T) {
	const rows = 20000
	after := openai.Abandon{AfterTokens: 2}
	for _, tt := range []struct {
		name     string
		a        Abandonment
		min, max float64 // share of rows picked
	}{
		{"half", Abandonment{Share: 0.5, Seed: 7, When: after}, 0.48, 0.52},
		{"a tenth", Abandonment{Share: 0.1, Seed: 7, When: openai.Abandon{After: time.Second}}, 0.09, 0.11},
		{"all", Abandonment{Share: 1, Seed: 7, When: after}, 1, 1},
		{"none", Abandonment{}, 0, 0},
		{"a share but no moment", Abandonment{Share: 0.5, Seed: 7}, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			for i := range rows {
				if tt.a.Picks(i) {
					n++
				}
			}
			if got := float64(n) / rows; got < tt.min || got > tt.max {
				t.Errorf("picked %.4f of the rows, want %v to %v", got, tt.min, tt.max)
			}
		})
	}
	// The same seed picks the same rows; another seed, others.
	a, b, c := Abandonment{Share: 0.5, Seed: 7, When: after}, Abandonment{Share: 0.5, Seed: 7, When: after}, Abandonment{Share: 0.5, Seed: 8, When: after}
	same, differ := true, 0
	for i := range 1000 {
		same = same && a.Picks(i) == b.Picks(i)
		if a.Picks(i) != c.Picks(i) {
			differ++
		}
	}
	if !same || differ < 400 {
		t.Errorf("same seed picks the same rows: %v; another seed differs on %d of 1000 rows", same, differ)
	}
}
