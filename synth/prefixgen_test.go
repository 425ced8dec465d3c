package synth

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

func sharedSpec() SharedPrefix {
	return SharedPrefix{
		Prefixes: 8, PrefixTokens: 1024, Requests: 4000,
		InputTokens: Lengths{Mean: 256, StdDev: 32}, OutputTokens: Lengths{Mean: 64, StdDev: 16},
		Turns: 1, Rate: 10, BlockSize: 16, Seed: 7,
	}
}

func generateShared(t *testing.T, s SharedPrefix) []trace.Record {
	t.Helper()
	var rows []trace.Record
	if err := GenerateSharedPrefix(s, func(r *trace.Record) error {
		rows = append(rows, r.Clone())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rows
}

func jsonLines(rows []trace.Record) string {
	var b []byte
	for i := range rows {
		b = append(rows[i].AppendJSON(b), '\n')
	}
	return string(b)
}

func TestSharedPrefixReproducible(t *testing.T) {
	s := sharedSpec()
	s.Turns = 3
	a, b := jsonLines(generateShared(t, s)), jsonLines(generateShared(t, s))
	if a != b {
		t.Fatal("two runs with the same parameters differ")
	}
	s.Seed++
	if jsonLines(generateShared(t, s)) == a {
		t.Fatal("another seed gives the same rows")
	}
}

// TestSharedPrefixStreams: each random quantity has its own stream, so
// changing the output lengths moves no input length, prefix or arrival.
func TestSharedPrefixStreams(t *testing.T) {
	s := sharedSpec()
	base := generateShared(t, s)
	s.OutputTokens = Lengths{Mean: 300, StdDev: 90}
	other := generateShared(t, s)
	for i := range base {
		a, b := base[i], other[i]
		if a.ISL() != b.ISL() || *a.Timestamp != *b.Timestamp || a.HashIDs[0] != b.HashIDs[0] {
			t.Fatalf("row %d: input %d, arrival %v, first id %d became %d, %v, %d when only output lengths changed",
				i, a.ISL(), *a.Timestamp, a.HashIDs[0], b.ISL(), *b.Timestamp, b.HashIDs[0])
		}
	}
	if jsonLines(base) == jsonLines(other) {
		t.Fatal("output lengths did not change")
	}
}

// TestSharedPrefixRows: the rows' shape: count, sessions, delays, arrivals
// at the rate, ids that fit, and later turns that extend the turn before.
func TestSharedPrefixRows(t *testing.T) {
	s := sharedSpec()
	s.Requests, s.Turns, s.TurnDelay, s.Arrivals = 1001, 4, 1500, ArrivalsConstant
	rows := generateShared(t, s)
	if len(rows) != 1001 {
		t.Fatalf("%d rows, want 1001", len(rows))
	}
	firsts := 0
	for i, r := range rows {
		if got, want := len(r.HashIDs), trace.FittingIDs(r.ISL(), s.BlockSize); got != want {
			t.Fatalf("row %d: %d ids for %d tokens, want %d", i, got, r.ISL(), want)
		}
		if r.SessionID == nil {
			t.Fatalf("row %d has no session_id", i)
		}
		turn := i % 4
		if turn == 0 {
			if r.Timestamp == nil || r.Delay != nil {
				t.Fatalf("row %d, a first turn: timestamp %v, delay %v", i, r.Timestamp, r.Delay)
			}
			// Constant arrivals: session k at k/rate seconds.
			if want := float64(firsts) * 100; math.Abs(*r.Timestamp-want) > 1e-3 {
				t.Fatalf("session %d arrives at %v ms, want %v", firsts, *r.Timestamp, want)
			}
			firsts++
			continue
		}
		prev := rows[i-1]
		if r.Timestamp != nil || r.Delay == nil || *r.Delay != 1500 || *r.SessionID != *prev.SessionID {
			t.Fatalf("row %d, turn %d: timestamp %v, delay %v, session %v after %v", i, turn, r.Timestamp, r.Delay, *r.SessionID, *prev.SessionID)
		}
		// A later turn holds the whole previous turn and its answer, and
		// repeats the ids of the previous turn's whole blocks.
		if r.ISL() <= prev.ISL()+prev.OSL() {
			t.Fatalf("row %d: %d tokens after a turn of %d and an answer of %d", i, r.ISL(), prev.ISL(), prev.OSL())
		}
		whole := prev.ISL() / s.BlockSize
		if !reflect.DeepEqual(r.HashIDs[:whole], prev.HashIDs[:whole]) || (whole < len(prev.HashIDs) && r.HashIDs[whole] == prev.HashIDs[whole]) {
			t.Fatalf("row %d does not extend the previous turn's %d whole blocks", i, whole)
		}
	}
	if firsts != 251 {
		t.Fatalf("%d sessions, want 251 (the last one short)", firsts)
	}
}

// TestSharedPrefixPoissonRate: exponential gaps average 1/rate.
func TestSharedPrefixPoissonRate(t *testing.T) {
	s := sharedSpec()
	s.Requests, s.Rate = 20000, 50
	rows := generateShared(t, s)
	span := *rows[len(rows)-1].Timestamp / 1000
	got := float64(len(rows)-1) / span
	t.Logf("%.3f requests a second over %d, asked %v", got, len(rows), s.Rate)
	if math.Abs(got/s.Rate-1) > 0.03 {
		t.Errorf("%.2f requests a second, want %v within 3 %%", got, s.Rate)
	}
}

// expectedTokenHitRate is the token hit rate an infinite cache gives on
// s's rows, derived from the parameters alone: a session whose prefix was
// used before hits the prefix's whole blocks; a later turn hits the whole
// blocks of the turn before (in the mean, its length less half a block).
func expectedTokenHitRate(s SharedPrefix) float64 {
	B := float64(s.BlockSize)
	L, mi, mo := float64(s.PrefixTokens), s.InputTokens.Mean, s.OutputTokens.Mean
	sessions := float64(s.Requests / s.Turns)
	P := float64(s.Prefixes)
	used := P * (1 - math.Pow(1-1/P, sessions)) // prefixes drawn at least once
	shared := math.Floor(L/B) * B
	hits := shared * (sessions - used)
	tokens := 0.0
	for k := range s.Turns {
		tokens += sessions * (L + float64(k+1)*mi + float64(k)*mo)
		if k > 0 {
			hits += sessions * (L + float64(k)*mi + float64(k-1)*mo - (B-1)/2)
		}
	}
	return hits / tokens
}

func TestSharedPrefixHitRate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*SharedPrefix)
	}{
		{"one turn", func(*SharedPrefix) {}},
		{"prefix not whole blocks", func(s *SharedPrefix) { s.BlockSize, s.PrefixTokens = 512, 1000 }},
		{"many prefixes", func(s *SharedPrefix) { s.Prefixes = 2000 }},
		{"sessions", func(s *SharedPrefix) { s.Turns = 4 }},
		{"no prefix", func(s *SharedPrefix) { s.PrefixTokens = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sharedSpec()
			tt.modify(&s)
			an := Analyze(generateShared(t, s), s.BlockSize)
			want := expectedTokenHitRate(s)
			t.Logf("token hit rate %.4f, implied %.4f", an.TokenHitRate, want)
			if math.Abs(an.TokenHitRate-want) > 0.02 {
				t.Errorf("token hit rate %.4f, the parameters imply %.4f", an.TokenHitRate, want)
			}
		})
	}
}

func TestSharedPrefixValidate(t *testing.T) {
	bad := SharedPrefix{Prefixes: 0, PrefixTokens: -1, Requests: 0, InputTokens: Lengths{Mean: 0.5, StdDev: -1},
		OutputTokens: Lengths{Mean: math.NaN()}, Turns: 0, TurnDelay: -1, Rate: 0, Arrivals: "burst", BlockSize: 0}
	err := bad.Validate(func(key string) string { return key })
	if err == nil {
		t.Fatal("no error")
	}
	for _, key := range []string{"prefixes", "prefix_tokens", "requests", "input_tokens.mean", "input_tokens.stddev",
		"output_tokens.mean", "turns", "turn_delay", "rate", "arrivals", "block_size"} {
		if !strings.Contains(err.Error(), "\n"+key+" ") && !strings.HasPrefix(err.Error(), key+" ") {
			t.Errorf("no error for %s in:\n%v", key, err)
		}
	}
	if err := GenerateSharedPrefix(bad, func(*trace.Record) error { return nil }); err == nil {
		t.Error("GenerateSharedPrefix accepted bad parameters")
	}
	if err := sharedSpec().Validate(func(key string) string { return key }); err != nil {
		t.Errorf("good parameters: %v", err)
	}
}

// TestSharedPrefixLengthsDraw: zero spread gives the mean, without a draw.
func TestSharedPrefixLengthsDraw(t *testing.T) {
	s := sharedSpec()
	s.InputTokens, s.OutputTokens = Lengths{Mean: 99.6}, Lengths{Mean: 3}
	for _, r := range generateShared(t, s)[:50] {
		if r.ISL() != s.PrefixTokens+100 || r.OSL() != 3 {
			t.Fatalf("row of %d/%d tokens, want %d/3", r.ISL(), r.OSL(), s.PrefixTokens+100)
		}
	}
}

// TestSharedPrefixBounds: every value that would make the generator
// allocate past its bounds, or make rows the daemon cannot send or
// schedule, is refused by Validate, named by its key, before anything is
// generated; values at the bounds pass.
func TestSharedPrefixBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*SharedPrefix)
		key  string // "" for a valid spec
	}{
		{"prefixes 2^60", func(s *SharedPrefix) { s.Prefixes = 1 << 60 }, "prefixes"},
		{"prefixes 2^33", func(s *SharedPrefix) { s.Prefixes = 1 << 33 }, "prefixes"},
		{"prefixes at the bound", func(s *SharedPrefix) { s.Prefixes = MaxGeneratedRows }, ""},
		{"16M-token prefix in 1-token blocks", func(s *SharedPrefix) {
			s.BlockSize, s.PrefixTokens, s.Requests = 1, 16e6, 200
		}, "requests"},
		{"prefix past a request", func(s *SharedPrefix) { s.PrefixTokens = MaxRowTokens }, "prefix_tokens"},
		{"input mean past a request", func(s *SharedPrefix) { s.InputTokens.Mean = 6e8 }, "input_tokens.mean"},
		{"output mean past a request", func(s *SharedPrefix) { s.OutputTokens.Mean = 2e7 }, "output_tokens.mean"},
		{"output spread past a request", func(s *SharedPrefix) { s.OutputTokens.StdDev = 1e300 }, "output_tokens.stddev"},
		{"output draws past a request", func(s *SharedPrefix) { s.OutputTokens.StdDev = MaxRowTokens / 8 }, "output_tokens"},
		{"turns grow the prompt past a request", func(s *SharedPrefix) {
			s.BlockSize, s.InputTokens, s.Turns, s.Requests = 1<<20, Lengths{Mean: 1e7}, 3, 3
		}, "prefix_tokens"},
		{"turns 2^40", func(s *SharedPrefix) { s.Turns = 1 << 40 }, "turns"},
		{"rate spreads past 100 years", func(s *SharedPrefix) { s.Rate = 1e-300 }, "rate"},
		{"constant rate spreads past 100 years", func(s *SharedPrefix) { s.Rate, s.Arrivals = 1e-9, ArrivalsConstant }, "rate"},
		{"turn delay of 200 years", func(s *SharedPrefix) { s.Turns, s.TurnDelay = 2, 200*365.25*24*3600e3 }, "turn_delay"},
		{"ids at the bound", func(s *SharedPrefix) {
			s.BlockSize, s.PrefixTokens, s.InputTokens, s.OutputTokens, s.Requests = 1, 1000, Lengths{Mean: 23}, Lengths{Mean: 1}, MaxGeneratedIDs/1024
		}, ""},
		{"ids past the bound", func(s *SharedPrefix) {
			s.BlockSize, s.PrefixTokens, s.InputTokens, s.OutputTokens, s.Requests = 1, 1000, Lengths{Mean: 24}, Lengths{Mean: 1}, MaxGeneratedIDs/1024
		}, "requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sharedSpec()
			tc.edit(&s)
			err := s.Validate(func(key string) string { return key })
			if tc.key == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.HasPrefix(err.Error(), tc.key+" ") {
				t.Errorf("error names the wrong key (want %s): %v", tc.key, err)
			}
		})
	}
}

// TestSharedPrefixHeldIDs: the bound on the ids is an upper bound of what
// the generator makes, and exact up to one id a row with whole blocks.
func TestSharedPrefixHeldIDs(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*SharedPrefix)
	}{
		{"one turn", func(*SharedPrefix) {}},
		{"sessions", func(s *SharedPrefix) { s.Turns, s.Requests = 5, 1003 }},
		{"fixed lengths", func(s *SharedPrefix) {
			s.Turns, s.InputTokens, s.OutputTokens = 3, Lengths{Mean: 160}, Lengths{Mean: 32}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sharedSpec()
			tc.edit(&s)
			var ids int
			for _, r := range generateShared(t, s) {
				ids += len(r.HashIDs)
			}
			if bound := s.HeldIDs(); float64(ids) > bound {
				t.Errorf("%d ids, above the bound %v", ids, bound)
			}
			if mean := s.MeanIDs(); math.Abs(float64(ids)-mean) > 0.1*mean+float64(s.Requests) {
				t.Errorf("%d ids, far from the mean estimate %v", ids, mean)
			}
		})
	}
}

// TestSharedPrefixTextFixed: a prefix's ids, and so its text, depend on the
// seed and its index only: runs that differ in the lengths, the requests
// or the turns give every row with prefix p the same leading ids.
func TestSharedPrefixTextFixed(t *testing.T) {
	base := sharedSpec()
	base.Prefixes, base.Requests = 16, 600
	shared := base.PrefixTokens / base.BlockSize
	// prefixOf maps each row's leading ids (its prefix's blocks) to the
	// prefix the row picked, learnt from the base run.
	prefixOf := map[string]int{}
	key := func(r trace.Record) string { return fmt.Sprint(r.HashIDs[:shared]) }
	baseRows := generateShared(t, base)
	picks := make([]int, len(baseRows))
	for i, r := range baseRows {
		picks[i] = int(r.HashIDs[0]) / shared
		prefixOf[key(r)] = picks[i]
	}
	if len(prefixOf) != base.Prefixes {
		t.Fatalf("%d distinct prefixes in %d rows, want %d", len(prefixOf), len(baseRows), base.Prefixes)
	}
	for _, tc := range []struct {
		name string
		edit func(*SharedPrefix)
	}{
		{"input mean 256 to 1024", func(s *SharedPrefix) { s.InputTokens = Lengths{Mean: 1024, StdDev: 128} }},
		{"fixed input", func(s *SharedPrefix) { s.InputTokens = Lengths{Mean: 7} }},
		{"output lengths", func(s *SharedPrefix) { s.OutputTokens = Lengths{Mean: 900, StdDev: 300} }},
		{"more requests", func(s *SharedPrefix) { s.Requests = 2000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.edit(&s)
			for i, r := range generateShared(t, s) {
				p, ok := prefixOf[key(r)]
				if !ok {
					t.Fatalf("row %d opens with ids %v, the text of no prefix of the base run", i, r.HashIDs[:shared])
				}
				if i < len(picks) && p != picks[i] {
					t.Fatalf("row %d opens with prefix %d's text, the base run's row had prefix %d", i, p, picks[i])
				}
			}
		})
	}
}

func TestUnsharedPrefixWarning(t *testing.T) {
	for _, tc := range []struct {
		name          string
		prefix, block int
		want          string // "" for no warning
	}{
		{"the blog's 256 tokens at 512", 256, 512, "--block-size of 256 "},
		{"300 tokens at 512", 300, 512, "--block-size of 256 "},
		{"one token", 1, 16, "--block-size of 1 "},
		{"just shorter", 511, 512, "--block-size of 256 "},
		{"a whole block", 512, 512, ""},
		{"longer", 2048, 512, ""},
		{"no prefix", 0, 512, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sharedSpec()
			s.PrefixTokens, s.BlockSize = tc.prefix, tc.block
			got := s.UnsharedPrefixWarning("--block-size")
			if tc.want == "" {
				if got != "" {
					t.Fatalf("warned: %s", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) || !strings.Contains(got, fmt.Sprintf("--block-size (%d tokens)", tc.block)) {
				t.Fatalf("warning %q does not name the block size %d and suggest %q", got, tc.block, tc.want)
			}
			// The suggestion shares: its rows have common prefix ids.
			s.BlockSize = SharingBlockSize(tc.prefix)
			if w := s.UnsharedPrefixWarning("--block-size"); w != "" {
				t.Fatalf("the suggested block size warns too: %s", w)
			}
			if an := Analyze(generateShared(t, s), s.BlockSize); !(an.TokenHitRate > 0) {
				t.Errorf("the suggested block size %d gives a token hit rate of %v", s.BlockSize, an.TokenHitRate)
			}
		})
	}
}
