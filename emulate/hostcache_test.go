package emulate

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// The host prompt cache behind llama.cpp's slots, request by request. The
// wants are worked out by hand from llama-server's rules (see slotCache):
// a slot taken by the least-recently-used rule, or one that would keep
// less than half of its prompt, saves its prompt and restores the cached
// one that serves the request better; the other idle slots are parked in
// the cache; the oldest prompts go first beyond the budget.
func TestHostCache(t *testing.T) {
	A, B, C, D := seq(1, 10), seq(100, 10), seq(200, 10), seq(300, 10)
	X := seq(500, 10)
	type step struct {
		do     func(*slotCache) // first, if any
		prompt []int            // then this request, if any, looked up and inserted
		salt   string
		hit    int // its cached tokens
		host   int // tokens in the host cache after the step
	}
	tests := []struct {
		name          string
		slots, budget int
		steps         []step
	}{
		{"a slot switch saves the prompt and restores it", 1, 100, []step{
			{prompt: A, hit: 0, host: 0},
			{prompt: B, hit: 0, host: 10}, // A saved as B takes the slot
			{prompt: A, hit: 9, host: 10}, // B saved, A restored: all but the last token
			{prompt: B, hit: 9, host: 10},
		}},
		{"off: the slot alone", 1, 0, []step{
			{prompt: A}, {prompt: B}, {prompt: A}, {prompt: B},
		}},
		{"more prompts than slots", 2, 100, []step{
			{prompt: A, hit: 0, host: 0},
			{prompt: B, hit: 0, host: 10}, // the idle slot holding A is parked
			{prompt: C, hit: 0, host: 20},
			{prompt: A, hit: 9, host: 20}, // restored into the empty slot; C parked
			{prompt: B, hit: 9, host: 20},
			{prompt: C, hit: 9, host: 20},
		}},
		{"off: more prompts than slots", 2, 0, []step{
			{prompt: A}, {prompt: B}, {prompt: C}, {prompt: A}, {prompt: B}, {prompt: C},
		}},
		{"the best match is restored", 1, 100, []step{
			{prompt: cat(seq(1, 4), seq(50, 6)), hit: 0, host: 0},
			// Shares 4 of the slot's 10: chosen for it, but would lose more
			// than half, so the slot's prompt is saved first.
			{prompt: cat(seq(1, 8), seq(60, 2)), hit: 4, host: 10},
			{prompt: X, hit: 0, host: 20},
			// Both cached prompts share a prefix; the one sharing 8 wins.
			{prompt: cat(seq(1, 9), []int{70}), hit: 8, host: 20},
		}},
		{"a long prompt is not thrown away for a short match", 1, 100, []step{
			{prompt: cat(seq(1, 4), seq(700, 16)), hit: 0, host: 0},
			{prompt: X, hit: 0, host: 20},
			{prompt: cat(seq(1, 4), seq(800, 6)), hit: 0, host: 30}, // 4 of 20 is under a quarter
		}},
		{"the oldest prompts go beyond the budget", 1, 35, []step{
			{prompt: A, hit: 0, host: 0},
			{prompt: B, hit: 0, host: 10},
			{prompt: C, hit: 0, host: 20},
			{prompt: D, hit: 0, host: 30},
			{prompt: A, hit: 0, host: 30}, // saving D evicted A
			{prompt: B, hit: 0, host: 30}, // saving A evicted B
			{prompt: D, hit: 9, host: 20}, // saving B evicted C; D was kept
		}},
		{"a prompt beyond the budget is not kept", 1, 5, []step{
			{prompt: A}, {prompt: B}, {prompt: A},
		}},
		{"disabled, then enabled", 1, 100, []step{
			{prompt: A, hit: 0, host: 0},
			{prompt: B, hit: 0, host: 10},
			{do: func(c *slotCache) { c.setEnabled(false) }, host: 0},
			{prompt: A, hit: 0, host: 0},
			{prompt: A, hit: 0, host: 0},
			{do: func(c *slotCache) { c.setEnabled(true) }},
			{prompt: A, hit: 0, host: 0},
			{prompt: A, hit: 9, host: 0},
		}},
		{"resized at run time", 1, 100, []step{
			{prompt: A}, {prompt: B, host: 10}, {prompt: C, host: 20}, {prompt: D, host: 30},
			{do: func(c *slotCache) { c.setHostBudget(20) }, host: 20}, // A evicted
			{prompt: A, hit: 0, host: 20},
			{do: func(c *slotCache) { c.setHostBudget(0) }, host: 0}, // off: emptied
			{prompt: B, hit: 0, host: 0},
			{prompt: B, hit: 9, host: 0}, // the slot alone
			{do: func(c *slotCache) { c.setHostBudget(100) }},
			{prompt: C, hit: 0, host: 10},
			{prompt: B, hit: 9, host: 10},
		}},
		{"salts do not mix", 1, 100, []step{
			{prompt: A, hit: 0, host: 0},
			{prompt: X, hit: 0, host: 10},
			{prompt: A, salt: "s", hit: 0, host: 20},
			{prompt: A, hit: 9, host: 20},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newSlotCache(tt.slots, true)
			c.setHostBudget(tt.budget)
			for i, s := range tt.steps {
				if s.do != nil {
					s.do(c)
				}
				if s.prompt != nil {
					hit, cl := c.lookup(s.salt, s.prompt)
					if hit != s.hit {
						t.Fatalf("step %d: hit %d, want %d", i, hit, s.hit)
					}
					c.insert(cl)
				}
				st := c.state()
				if st.HostTokens != s.host {
					t.Fatalf("step %d: host cache holds %d tokens, want %d (%+v)", i, st.HostTokens, s.host, st)
				}
				if st.HostTokens > tt.budget {
					t.Fatalf("step %d: host cache holds %d tokens beyond its budget %d", i, st.HostTokens, tt.budget)
				}
			}
		})
	}
}

// What a save keeps: a prompt the cache already holds whole is not saved
// again, one that extends cached prompts replaces them, and salts are
// apart.
func TestHostCacheSave(t *testing.T) {
	type save struct {
		salt   string
		tokens []int
	}
	tests := []struct {
		name  string
		saves []save
		want  [][]int // the entries, oldest first
	}{
		{"a prefix of a cached prompt", []save{{"", seq(1, 20)}, {"", seq(1, 10)}}, [][]int{seq(1, 20)}},
		{"the same prompt twice", []save{{"", seq(1, 10)}, {"", seq(1, 10)}}, [][]int{seq(1, 10)}},
		{"an extension replaces what it extends", []save{{"", seq(1, 10)}, {"", seq(50, 5)}, {"", seq(1, 20)}},
			[][]int{seq(50, 5), seq(1, 20)}},
		{"another salt", []save{{"a", seq(1, 20)}, {"b", seq(1, 10)}}, [][]int{seq(1, 20), seq(1, 10)}},
		{"empty", []save{{"", nil}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hostCache{budget: 100}
			for _, s := range tt.saves {
				h.save(s.salt, s.tokens)
			}
			var got [][]int
			total := 0
			for _, e := range h.entries {
				got = append(got, e.tokens)
				total += len(e.tokens)
			}
			if !slices.EqualFunc(got, tt.want, slices.Equal) || total != h.tokens {
				t.Fatalf("entries %v (%d tokens counted), want %v", got, h.tokens, tt.want)
			}
		})
	}
}

// Over HTTP, with more distinct prompts than slots: the cached tokens in
// usage and timings.cache_n are what the slots and the host cache really
// reused, /emulator/cache halves the host cache or disables all reuse at
// run time, and the llamacpp counters agree with the ground truth.
func TestHostCacheServer(t *testing.T) {
	e, srv := newTestServer(t, Config{Engine: PersonalityLlamaCpp, Slots: 2, CacheRAMTokens: 240})
	prompts := make([][]int, 6) // 240 tokens in all, three times the slots
	for i := range prompts {
		prompts[i] = seq(1000*(i+1), 40)
	}
	round := func(want int) {
		t.Helper()
		for i, p := range prompts {
			var c wireChunk
			postDecode(t, srv.URL+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 2}, http.StatusOK, &c)
			if got := c.Usage.cached(t); got != want || c.Timings == nil || c.Timings.CacheN != got {
				t.Fatalf("prompt %d: cached %d, timings %+v; want %d in both", i, got, c.Timings, want)
			}
		}
	}
	control := func(body map[string]any) CacheState {
		t.Helper()
		var st CacheState
		postDecode(t, srv.URL+"/emulator/cache", body, http.StatusOK, &st)
		return st
	}
	round(0)
	round(39) // each prompt restored from the host cache
	control(map[string]any{"enabled": false})
	round(0)
	if st := control(map[string]any{"enabled": true}); !st.Enabled || st.Blocks != 0 || st.CacheRAMTokens != 240 {
		t.Fatalf("state after enabling %+v", st)
	}
	round(0)
	round(39)
	// Halved, it holds three of the six prompts, each evicted before its
	// turn comes again.
	if st := control(map[string]any{"cache_ram_tokens": 120}); st.CacheRAMTokens != 120 || st.HostTokens > 120 {
		t.Fatalf("state after halving %+v", st)
	}
	round(0)
	round(0)
	if got := e.Config().CacheRAMTokens; got != 120 {
		t.Fatalf("config cache_ram_tokens %d, want 120", got)
	}
	st := e.Stats()
	if st.CacheHitTokens != 2*6*39 || st.CachedTokens != st.CacheHitTokens {
		t.Fatalf("stats %+v", st)
	}
	for name, want := range map[string]int64{
		"llamacpp:prompt_tokens_cached_total": st.CacheHitTokens,
		"llamacpp:prompt_tokens_total":        st.CacheQueryTokens - st.CacheHitTokens,
	} {
		if got, ok := gathered(t, e.Gatherer(), name); !ok || got != float64(want) {
			t.Errorf("%s = %v (present %v), want %d", name, got, ok, want)
		}
	}

	if st := control(map[string]any{"cache_ram_tokens": 0}); st.CacheRAMTokens != 0 || st.HostPrompts != 0 {
		t.Fatalf("state after turning the host cache off %+v", st)
	}
	if got := e.Config().CacheRAMTokens; got != -1 {
		t.Fatalf("config cache_ram_tokens %d with the host cache off, want -1", got)
	}
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"cache_ram_tokens": -1}, http.StatusBadRequest, nil)
	_, vsrv := newTestServer(t, Config{})
	postDecode(t, vsrv.URL+"/emulator/cache", map[string]any{"cache_ram_tokens": 100}, http.StatusBadRequest, nil)
}

// The llamacpp personality has llama-server's host prompt cache by
// default; -1 turns it off, and the keys are refused where they do not
// apply.
func TestHostCacheConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want int    // CacheRAMTokens in force
		err  string // substring of New's error; "" for valid
	}{
		{"default", Config{Engine: PersonalityLlamaCpp}, DefaultCacheRAMTokens, ""},
		{"sized", Config{Engine: PersonalityLlamaCpp, CacheRAMTokens: 1000}, 1000, ""},
		{"off", Config{Engine: PersonalityLlamaCpp, CacheRAMTokens: -1}, -1, ""},
		{"below -1", Config{Engine: PersonalityLlamaCpp, CacheRAMTokens: -2}, 0, "cache_ram_tokens"},
		{"not llamacpp", Config{CacheRAMTokens: 1000}, 0, "cache_ram_tokens"},
		{"hidden vllm", Config{HideCacheConfig: true}, 0, ""},
		{"hidden sglang", Config{Engine: PersonalitySGLang, HideCacheConfig: true}, 0, ""},
		{"hidden trtllm", Config{Engine: PersonalityTRTLLM, HideCacheConfig: true}, 0, "hide_cache_config"},
		{"hidden llamacpp", Config{Engine: PersonalityLlamaCpp, HideCacheConfig: true}, 0, "hide_cache_config"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, err := New(tt.cfg)
			if (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("New: %v, want %q", err, tt.err)
			}
			if err != nil {
				return
			}
			if got := e.Config().CacheRAMTokens; got != tt.want {
				t.Fatalf("cache_ram_tokens %d, want %d", got, tt.want)
			}
		})
	}
}
