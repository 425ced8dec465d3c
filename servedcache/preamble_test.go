package servedcache

import "testing"

func TestPreambleTokens(t *testing.T) {
	tests := []struct {
		name    string
		samples []int
		want    int
	}{
		{"none", nil, 0},
		{"too few", []int{1, 1, 1, 1, 1, 1, 1}, 0},
		{"BOS on every unrelated prompt", []int{1, 1, 1, 1, 1, 1, 1, 1}, 1},
		{"chat header", []int{5, 5, 7, 5, 5, 5, 9, 5, 5}, 5},
		{"one cold answer does not hide it", []int{5, 5, 5, 5, 5, 5, 5, 5, 0}, 5},
		{"a cold engine does", []int{0, 0, 0, 5, 5, 5, 5, 5}, 0},
		{"chance hits do not raise it", []int{5, 5, 6, 7, 6, 9, 6, 8}, 6},
		{"a cold engine ages out", append(repeat(0, 8), repeat(5, preambleWindow)...), 5},
		{"too large to be a preamble", []int{500, 500, 500, 500, 500, 500, 500, 500}, 0},
		{"at the bound", []int{64, 64, 64, 64, 64, 64, 64, 64}, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p preamble
			for _, v := range tt.samples {
				p.observe(v)
			}
			if got := p.tokens(); got != tt.want {
				t.Errorf("tokens() = %d, want %d", got, tt.want)
			}
		})
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}
