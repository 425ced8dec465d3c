package engine

import (
	"slices"
	"testing"
)

// TestServerScraperBaselineFlag: only the first read a scraper makes is
// its baseline, whether it was Prime's or Run's; a rejected first read
// leaves the next one the baseline.
func TestServerScraperBaselineFlag(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		want   []bool // Baseline of each read that was not rejected
	}{
		{"first read", []float64{100, 150, 170}, []bool{true, false, false}},
		{"a rejected first read", []float64{-1, 100, 150}, []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
			var got []bool
			for _, v := range tt.values {
				c, err := s.counts(engineRead{cached: seriesValues{"": v}, prompt: seriesValues{"": 10 * v}})
				if err == nil {
					got = append(got, c.Baseline)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Baseline of each read = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCountsPromptTokens(t *testing.T) {
	got := CountingPromptTokens()
	want := []Dialect{DialectVLLM, DialectSGLang, DialectLlamaCpp}
	if !slices.Equal(got, want) {
		t.Errorf("CountingPromptTokens() = %v, want %v", got, want)
	}
}
