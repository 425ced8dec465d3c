package emulate

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.yaml.in/yaml/v3"
)

// slotIndex is the index of a claim's slot.
func slotIndex(c *slotCache, cl claim) int { return slices.Index(c.slots, cl.slot) }

// A request runs in the slot sharing the longest prefix with it; ties and
// nothing shared go to the least recently used slot.
func TestSlotChoice(t *testing.T) {
	a, b, c := seq(1, 10), seq(100, 10), seq(300, 4)
	x, y := cat([]int{7, 7}, seq(1, 5)), cat([]int{7, 7}, seq(50, 5))
	type step struct {
		prompt    []int
		hit, slot int
	}
	tests := []struct {
		name  string
		slots int
		steps []step
	}{
		{"two slots", 2, []step{
			{a, 0, 0},                             // both empty: the first
			{b, 0, 1},                             // nothing shared: the unused slot
			{a, 9, 0},                             // its own slot, all but the last token
			{cat(seq(100, 5), seq(200, 5)), 5, 1}, // shares 5 with b
			{c, 0, 0},                             // nothing shared: slot 0 is the older
			{a, 0, 1},                             // a was overwritten by c; slot 1 is older
		}},
		{"one slot", 1, []step{{a, 0, 0}, {b, 0, 0}, {a, 0, 0}, {a, 9, 0}}},
		{"longest prefix beats recency", 2, []step{
			{x, 0, 0},
			{y, 2, 0}, // shares the two leading 7s with x, in slot 0
			{x, 2, 0}, // slot 0 now holds y; still the longest shared prefix
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := newSlotCache(tt.slots, true)
			for i, s := range tt.steps {
				hit, cl := sc.lookup("", s.prompt)
				if hit != s.hit || slotIndex(sc, cl) != s.slot {
					t.Fatalf("step %d: hit %d in slot %d, want %d in slot %d", i, hit, slotIndex(sc, cl), s.hit, s.slot)
				}
				sc.insert(cl)
			}
		})
	}
}

// A slot in use is not given to another request while an idle one is
// left; with none idle, requests share.
func TestSlotBusy(t *testing.T) {
	sc := newSlotCache(2, true)
	a := seq(1, 10)
	_, cl := sc.lookup("", a)
	sc.insert(cl) // a in slot 0
	h1, c1 := sc.lookup("", a)
	h2, c2 := sc.lookup("", a) // slot 0 is busy
	if h1 != 9 || slotIndex(sc, c1) != 0 || h2 != 0 || slotIndex(sc, c2) != 1 {
		t.Fatalf("hits %d, %d in slots %d, %d", h1, h2, slotIndex(sc, c1), slotIndex(sc, c2))
	}
	h3, c3 := sc.lookup("", a) // both busy: the best one is shared
	if h3 != 9 || slotIndex(sc, c3) != 0 {
		t.Fatalf("hit %d in slot %d with every slot busy", h3, slotIndex(sc, c3))
	}
	sc.release(c1)
	sc.release(c3)
	sc.insert(c2)
	if st := sc.state(); st.Blocks != 2 || st.Tokens != 20 || st.CapacityBlocks != 2 {
		t.Fatalf("state %+v", st)
	}
}

// Disable, flush and resize in the llamacpp personality, where the
// capacity is the number of slots.
func TestSlotControl(t *testing.T) {
	e, srv := newTestServer(t, Config{Engine: PersonalityLlamaCpp, Slots: 2})
	a, b := seq(1, 10), seq(100, 10)
	complete(t, srv.URL, a, nil)
	complete(t, srv.URL, b, nil)
	if got := complete(t, srv.URL, a, nil).cached(t); got != 9 {
		t.Fatalf("warm hit %d", got)
	}
	// a is in its slot again, b in the host prompt cache.
	if st := e.Stats().Cache; st != (CacheState{Enabled: true, BlockSize: 1, CapacityBlocks: 2, Blocks: 2, Tokens: 20,
		CacheRAMTokens: DefaultCacheRAMTokens, HostPrompts: 1, HostTokens: 10}) {
		t.Fatalf("state %+v", st)
	}

	e.SetCacheEnabled(false)
	if st := e.Stats().Cache; st.Enabled || st.Blocks != 0 {
		t.Fatalf("disabled state %+v", st)
	}
	complete(t, srv.URL, a, nil)
	if got := complete(t, srv.URL, a, nil).cached(t); got != 0 {
		t.Fatalf("disabled cache hit %d", got)
	}
	e.SetCacheEnabled(true)
	complete(t, srv.URL, a, nil)
	complete(t, srv.URL, b, nil)
	e.Flush()
	if st := e.Stats().Cache; st.Blocks != 0 || st.CapacityBlocks != 2 {
		t.Fatalf("state after flush %+v", st)
	}
	if got := complete(t, srv.URL, a, nil).cached(t); got != 0 {
		t.Fatalf("hit %d after flush", got)
	}

	complete(t, srv.URL, b, nil) // b is now the most recent
	if err := e.Resize(1); err != nil {
		t.Fatal(err)
	}
	if got := complete(t, srv.URL, b, nil).cached(t); got != 9 {
		t.Fatalf("the most recent slot should survive a shrink: hit %d", got)
	}
	if err := e.Resize(0); err == nil {
		t.Fatal("Resize(0) succeeded with llamacpp")
	}
	var st CacheState
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": 3}, http.StatusOK, &st)
	if st.CapacityBlocks != 3 || e.Config().Slots != 3 || e.Config().CapacityBlocks != 0 {
		t.Fatalf("state %+v, config %+v", st, e.Config())
	}
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": 0}, http.StatusBadRequest, nil)
}

// completeText sends a text prompt and returns the whole response.
func completeText(t *testing.T, base, prompt string) wireChunk {
	t.Helper()
	var c wireChunk
	postDecode(t, base+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}, http.StatusOK, &c)
	return c
}

// With bos, unrelated prompts share the BOS token, which llama.cpp's slot
// reuses (and chat prompts their template header too); block-granular
// vLLM hits nothing. Token-id prompts get no BOS.
func TestBOS(t *testing.T) {
	const p1, p2 = "The quick brown fox jumps over the lazy dog.", "Zebras graze on the savanna at dawn."
	_, srv := newTestServer(t, Config{Engine: PersonalityLlamaCpp, BOS: true})
	var tok tokenizeResponse
	postDecode(t, srv.URL+"/tokenize", map[string]any{"prompt": p1, "return_token_strs": true}, http.StatusOK, &tok)
	if tok.Tokens[0] != bosToken || tok.TokenStrs[0] != bosText || strings.Join(tok.TokenStrs[1:], "") != p1 {
		t.Fatalf("tokenize %+v", tok)
	}
	var detok struct {
		Prompt string `json:"prompt"`
	}
	postDecode(t, srv.URL+"/detokenize", map[string]any{"tokens": tok.Tokens}, http.StatusOK, &detok)
	if detok.Prompt != bosText+p1 {
		t.Fatalf("detokenize %q", detok.Prompt)
	}
	if c := completeText(t, srv.URL, p1); c.Usage.PromptTokens != tok.Count || c.Usage.cached(t) != 0 {
		t.Fatalf("usage %+v, tokenize count %d", c.Usage, tok.Count)
	}
	if got := completeText(t, srv.URL, p2).Usage.cached(t); got != 1 {
		t.Fatalf("unrelated text prompt hit %d, want 1 (the BOS)", got)
	}

	// Two unrelated chats share the BOS and the template's header.
	chatTokens := func(content string) []int {
		var r tokenizeResponse
		postDecode(t, srv.URL+"/tokenize", map[string]any{"messages": []map[string]any{{"role": "user", "content": content}}}, http.StatusOK, &r)
		return r.Tokens
	}
	shared := commonPrefix(chatTokens(p1), chatTokens(p2))
	if shared < 2 {
		t.Fatalf("chats share %d tokens", shared)
	}
	var c wireChunk
	postDecode(t, srv.URL+"/v1/chat/completions", chatBody(p1, map[string]any{"max_tokens": 1}), http.StatusOK, &c)
	postDecode(t, srv.URL+"/v1/chat/completions", chatBody(p2, map[string]any{"max_tokens": 1}), http.StatusOK, &c)
	if got := c.Usage.cached(t); got != shared {
		t.Fatalf("unrelated chat hit %d, want the %d shared header tokens", got, shared)
	}

	// Token ids are taken as sent.
	if u := complete(t, srv.URL, []int{5, 6, 7}, nil); u.PromptTokens != 3 {
		t.Fatalf("token-id prompt of 3 counted %d", u.PromptTokens)
	}

	_, vsrv := newTestServer(t, Config{BOS: true})
	completeText(t, vsrv.URL, p1)
	if got := completeText(t, vsrv.URL, p2).Usage.cached(t); got != 0 {
		t.Fatalf("vllm hit %d on unrelated prompts", got)
	}
}

// llama.cpp's timings.cache_n rides on the last chunk (or the body) and
// agrees with usage; other personalities send no timings.
func TestTimingsCacheN(t *testing.T) {
	prompt := seq(1, 20)
	for _, tt := range []struct {
		name   string
		stream bool
		usage  bool
	}{{"non-streaming", false, false}, {"stream with usage", true, true}, {"stream without usage", true, false}} {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range []Personality{PersonalityLlamaCpp, PersonalityVLLM} {
				_, srv := newTestServer(t, Config{Engine: p})
				complete(t, srv.URL, prompt, nil)
				body := map[string]any{"prompt": prompt, "max_tokens": 3, "stream": tt.stream}
				if tt.usage {
					body["stream_options"] = map[string]any{"include_usage": true}
				}
				resp := post(t, context.Background(), srv.URL+"/v1/completions", body)
				var chunks []wireChunk
				if tt.stream {
					events, err := readSSE(resp.Body)
					if err != nil {
						t.Fatal(err)
					}
					for _, ev := range events[:len(events)-1] {
						var c wireChunk
						if err := json.Unmarshal([]byte(ev), &c); err != nil {
							t.Fatal(err)
						}
						chunks = append(chunks, c)
					}
				} else {
					var c wireChunk
					if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
						t.Fatal(err)
					}
					chunks = append(chunks, c)
				}
				resp.Body.Close()
				for i, c := range chunks {
					last := i == len(chunks)-1
					if p != PersonalityLlamaCpp || !last {
						if c.Timings != nil {
							t.Fatalf("%s: chunk %d of %d has timings", p, i, len(chunks))
						}
						continue
					}
					if c.Timings == nil || c.Timings.CacheN != 19 || c.Timings.PromptN != 1 || c.Timings.PredictedN != 3 {
						t.Fatalf("last chunk timings %+v", c.Timings)
					}
					if c.Usage != nil && c.Usage.cached(t) != c.Timings.CacheN {
						t.Fatalf("usage %+v, timings %+v", c.Usage, c.Timings)
					}
				}
			}
		})
	}
}

// gathered returns the value of an unlabelled-or-single series by name,
// and whether it exists.
func gathered(t *testing.T, g prometheus.Gatherer, name string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
		return 0, true
	}
	return 0, false
}

// Each personality exports its engine's metric names, and their values
// are the ground truth of Stats.
func TestPersonalityMetrics(t *testing.T) {
	vllmNames := []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
		"vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:cache_config_info"}
	tests := []struct {
		p       Personality
		want    map[string]func(Stats) int64 // name: expected value
		absent  []string
		exposed []string // present, value not checked
	}{
		{PersonalityVLLM, map[string]func(Stats) int64{
			"vllm:prefix_cache_queries_total": func(s Stats) int64 { return s.CacheQueryTokens },
			"vllm:prefix_cache_hits_total":    func(s Stats) int64 { return s.CacheHitTokens },
			"vllm:prompt_tokens_total":        func(s Stats) int64 { return s.PromptTokens },
			"vllm:generation_tokens_total":    func(s Stats) int64 { return s.CompletionTokens },
		}, []string{"sglang:cached_tokens_total", "llamacpp:prompt_tokens_total"}, vllmNames},
		{PersonalitySGLang, map[string]func(Stats) int64{
			"sglang:cached_tokens_total":     func(s Stats) int64 { return s.CacheHitTokens },
			"sglang:prompt_tokens_total":     func(s Stats) int64 { return s.CacheQueryTokens },
			"sglang:generation_tokens_total": func(s Stats) int64 { return s.CompletionTokens },
		}, vllmNames, []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:time_to_first_token_seconds"}},
		{PersonalityTRTLLM, nil, append(vllmNames, "sglang:cached_tokens_total"), []string{"trtllm_time_to_first_token_seconds"}},
		{PersonalityLlamaCpp, map[string]func(Stats) int64{
			"llamacpp:prompt_tokens_total":        func(s Stats) int64 { return s.CacheQueryTokens - s.CacheHitTokens },
			"llamacpp:prompt_tokens_cached_total": func(s Stats) int64 { return s.CacheHitTokens },
			"llamacpp:tokens_predicted_total":     func(s Stats) int64 { return s.CompletionTokens },
		}, vllmNames, []string{"llamacpp:requests_processing", "llamacpp:requests_deferred"}},
	}
	for _, tt := range tests {
		t.Run(tt.p.String(), func(t *testing.T) {
			e, srv := newTestServer(t, Config{Engine: tt.p, Model: "emu"})
			for _, p := range [][]int{seq(1, 40), seq(1, 40), seq(1, 70), seq(500, 9), cat(seq(1, 35), seq(900, 5))} {
				complete(t, srv.URL, p, map[string]any{"model": "emu"})
			}
			st := e.Stats()
			if st.CacheHitTokens == 0 || st.CachedTokens != st.CacheHitTokens || st.PromptTokens != st.CacheQueryTokens {
				t.Fatalf("stats %+v", st)
			}
			for name, f := range tt.want {
				if got, ok := gathered(t, e.Gatherer(), name); !ok || got != float64(f(st)) {
					t.Errorf("%s = %v (present %v), want %d", name, got, ok, f(st))
				}
			}
			for _, name := range tt.exposed {
				if _, ok := gathered(t, e.Gatherer(), name); !ok {
					t.Errorf("%s missing", name)
				}
			}
			for _, name := range tt.absent {
				if _, ok := gathered(t, e.Gatherer(), name); ok {
					t.Errorf("%s exported by %s", name, tt.p)
				}
			}
			problems, err := testutil.GatherAndLint(e.Gatherer())
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				if p.Text != "metric names should not contain ':'" {
					t.Errorf("lint: %s: %s", p.Metric, p.Text)
				}
			}
		})
	}
}

// vllm:cache_config_info carries the configured capacity, and keeps it
// through a run-time resize or disable, as vLLM only changes it on
// restart; a redeploy changes it.
func TestCacheConfigInfo(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"bounded", Config{BlockSize: 16, CapacityBlocks: 100},
			`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="100"} 1`},
		{"unbounded, disabled, other block size", Config{BlockSize: 4, DisablePrefixCache: true},
			`vllm:cache_config_info{block_size="4",enable_prefix_caching="False",engine="0",num_gpu_blocks="0"} 1`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, srv := newTestServer(t, tt.cfg)
			check := func(want string) {
				t.Helper()
				expo := "# HELP vllm:cache_config_info Prefix cache configuration of the engine's (re)deployment, in the labels; num_gpu_blocks 0 means unbounded (emulator only).\n" +
					"# TYPE vllm:cache_config_info gauge\n" + want + "\n"
				if err := testutil.ScrapeAndCompare(srv.URL+"/metrics", strings.NewReader(expo), "vllm:cache_config_info"); err != nil {
					t.Fatal(err)
				}
			}
			check(tt.want)
			if err := e.Resize(3); err != nil {
				t.Fatal(err)
			}
			e.SetCacheEnabled(!tt.cfg.DisablePrefixCache)
			check(tt.want)
			var st CacheState
			postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": 7, "redeploy": true}, http.StatusOK, &st)
			if st.CapacityBlocks != 7 || st.Blocks != 0 {
				t.Errorf("after a redeploy to 7 blocks the cache is %+v, want 7 blocks, empty", st)
			}
			check(strings.Replace(tt.want, `num_gpu_blocks="`+strconv.Itoa(tt.cfg.CapacityBlocks)+`"`, `num_gpu_blocks="7"`, 1))
			postDecode(t, srv.URL+"/emulator/cache", map[string]any{"redeploy": true}, http.StatusBadRequest, nil)
		})
	}
}

// hide_cache_config leaves vllm:cache_config_info out, as an engine whose
// capacity cannot be read.
func TestCacheConfigInfoHidden(t *testing.T) {
	_, srv := newTestServer(t, Config{CapacityBlocks: 100, HideCacheConfig: true})
	if err := testutil.ScrapeAndCompare(srv.URL+"/metrics", strings.NewReader(""), "vllm:cache_config_info"); err != nil {
		t.Fatal(err)
	}
}

func getJSON(t *testing.T, url string, want int, out any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("GET %s: status %d, want %d; %s", url, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
	}
}

// SGLang's /get_server_info and llama.cpp's /props give the capacity of
// the engine's (re)deployment: a run-time resize (a KV cut the exporter
// must see in the hits) leaves it, a redeploy changes it; each exists only
// in its personality, and hide_cache_config leaves SGLang's out.
func TestCapacityEndpoints(t *testing.T) {
	e, srv := newTestServer(t, Config{Engine: PersonalitySGLang, CapacityBlocks: 5000, MaxModelLen: 8192})
	var info struct {
		PageSize          *int    `json:"page_size"`
		MaxTotalNumTokens *int    `json:"max_total_num_tokens"`
		ContextLength     int     `json:"context_length"`
		ModelPath         *string `json:"model_path"`
	}
	if err := e.Resize(10); err != nil {
		t.Fatal(err)
	}
	getJSON(t, srv.URL+"/get_server_info", http.StatusOK, &info)
	if info.PageSize == nil || *info.PageSize != 1 || info.MaxTotalNumTokens == nil || *info.MaxTotalNumTokens != 5000 ||
		info.ContextLength != 8192 || info.ModelPath == nil {
		t.Fatalf("server info %+v", info)
	}
	if err := e.Redeploy(4000); err != nil {
		t.Fatal(err)
	}
	getJSON(t, srv.URL+"/get_server_info", http.StatusOK, &info)
	if *info.MaxTotalNumTokens != 4000 {
		t.Fatalf("server info after a redeploy to 4,000 blocks: %+v", info)
	}
	getJSON(t, srv.URL+"/props", http.StatusNotFound, nil)

	e, srv = newTestServer(t, Config{Engine: PersonalityLlamaCpp, Slots: 4, MaxModelLen: 4096})
	var props struct {
		TotalSlots                int `json:"total_slots"`
		DefaultGenerationSettings struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if err := e.Resize(2); err != nil {
		t.Fatal(err)
	}
	getJSON(t, srv.URL+"/props", http.StatusOK, &props)
	if props.TotalSlots != 4 || props.DefaultGenerationSettings.NCtx != 4096 {
		t.Fatalf("props %+v", props)
	}
	if err := e.Redeploy(3); err != nil {
		t.Fatal(err)
	}
	getJSON(t, srv.URL+"/props", http.StatusOK, &props)
	if props.TotalSlots != 3 {
		t.Fatalf("props after a redeploy to 3 slots: %+v", props)
	}
	getJSON(t, srv.URL+"/get_server_info", http.StatusNotFound, nil)

	_, srv = newTestServer(t, Config{})
	getJSON(t, srv.URL+"/get_server_info", http.StatusNotFound, nil)
	getJSON(t, srv.URL+"/props", http.StatusNotFound, nil)

	_, srv = newTestServer(t, Config{Engine: PersonalitySGLang, CapacityBlocks: 5000, HideCacheConfig: true})
	getJSON(t, srv.URL+"/get_server_info", http.StatusNotFound, nil)
}

func TestPersonalityConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"unknown engine", Config{Engine: Personality(9)}, "engine"},
		{"slots without llamacpp", Config{Slots: 2}, "slots"},
		{"llamacpp block size", Config{Engine: PersonalityLlamaCpp, BlockSize: 16}, "block_size"},
		{"llamacpp capacity", Config{Engine: PersonalityLlamaCpp, CapacityBlocks: 8}, "capacity_blocks"},
		{"negative slots", Config{Engine: PersonalityLlamaCpp, Slots: -1}, "slots"},
		{"llamacpp explicit block 1", Config{Engine: PersonalityLlamaCpp, BlockSize: 1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("New: %v, want %q", err, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		p                       Personality
		block, slots, maxRuning int
	}{
		{PersonalityVLLM, 16, 0, DefaultMaxRunning},
		{PersonalitySGLang, 1, 0, DefaultMaxRunning},
		{PersonalityTRTLLM, 32, 0, DefaultMaxRunning},
		{PersonalityLlamaCpp, 1, 1, 1},
	} {
		e, err := New(Config{Engine: tt.p})
		if err != nil {
			t.Fatal(err)
		}
		if c := e.Config(); c.BlockSize != tt.block || c.Slots != tt.slots || c.MaxRunning != tt.maxRuning {
			t.Errorf("%s defaults: block %d slots %d max_running %d", tt.p, c.BlockSize, c.Slots, c.MaxRunning)
		}
	}
}

// The engine field reads and writes as a name in YAML.
func TestPersonalityYAML(t *testing.T) {
	var c Config
	if err := yaml.Unmarshal([]byte("engine: llamacpp\nslots: 2\nbos: true\n"), &c); err != nil {
		t.Fatal(err)
	}
	if c.Engine != PersonalityLlamaCpp || c.Slots != 2 || !c.BOS {
		t.Fatalf("decoded %+v", c)
	}
	out, err := yaml.Marshal(Config{Engine: PersonalityTRTLLM})
	if err != nil || !strings.Contains(string(out), "engine: trtllm\n") {
		t.Fatalf("encoded %q, %v", out, err)
	}
	if err := yaml.Unmarshal([]byte("engine: tgi\n"), &c); err == nil || !strings.Contains(err.Error(), "unknown engine") {
		t.Fatalf("unknown engine: %v", err)
	}
	if p, err := ParsePersonality(""); err != nil || p != PersonalityVLLM {
		t.Fatalf("empty engine: %v %v", p, err)
	}
}

// Concurrent requests in every personality: race-free, every slot freed,
// and the ground truth still adds up.
func TestPersonalitiesConcurrent(t *testing.T) {
	for _, p := range []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityTRTLLM, PersonalityLlamaCpp} {
		t.Run(p.String(), func(t *testing.T) {
			cfg := Config{Engine: p, MaxRunning: 4}
			if p == PersonalityLlamaCpp {
				cfg.Slots = 3 // fewer slots than running requests: some share
			} else {
				cfg.CapacityBlocks = 50
			}
			e, srv := newTestServer(t, cfg)
			errs := make(chan error, 64)
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for i := range 4 {
						resp, err := doRawNoFatal(srv.URL+"/v1/completions",
							map[string]any{"prompt": cat(seq(0, 40), seq(1000*(g%5)+i, 30)), "max_tokens": 2})
						if err != nil {
							errs <- err
							return
						}
						resp.Body.Close()
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			st := e.Stats()
			if st.Success != 64 || st.CachedTokens != st.CacheHitTokens || st.CacheHitTokens == 0 || st.Running != 0 {
				t.Fatalf("stats %+v", st)
			}
			if sc, ok := e.cache.(*slotCache); ok {
				for i, s := range sc.slots {
					if s.busy {
						t.Fatalf("slot %d still busy", i)
					}
				}
			}
			if tc, ok := e.cache.(*trieCache); ok {
				checkTrie(t, tc)
			}
		})
	}
}

// llama.cpp's timings.prompt_ms is the request's own prefill by the timing
// model (overhead plus the uncached tokens' cost), not the time it waited
// for a slot: a request queued behind one that holds the only slot (and no
// host prompt cache to restore its prompt from) reports
// the same prefill as one that did not wait.
func TestTimingsPromptMS(t *testing.T) {
	_, srv := newTestServer(t, Config{Engine: PersonalityLlamaCpp, CacheRAMTokens: -1, Overhead: 2 * time.Millisecond,
		PrefillPerToken: time.Millisecond, InterToken: 10 * time.Millisecond})
	prompt := seq(1, 20)
	promptMS := func() (float64, time.Duration) {
		t.Helper()
		start := time.Now()
		var c wireChunk
		postDecode(t, srv.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, http.StatusOK, &c)
		if c.Timings == nil {
			t.Fatal("no timings")
		}
		return c.Timings.PromptMS, time.Since(start)
	}
	// Cold: 20 tokens computed; then 19 of them cached, 1 computed.
	if got, _ := promptMS(); got != 22 {
		t.Errorf("cold: prompt_ms %v, want 22 (2 + 20 × 1)", got)
	}
	if got, _ := promptMS(); got != 3 {
		t.Errorf("warm: prompt_ms %v, want 3 (2 + 1 × 1)", got)
	}
	// Another prompt holds the only slot, decoding 30 tokens 10 ms apart.
	resp := post(t, context.Background(), srv.URL+"/v1/completions",
		map[string]any{"prompt": seq(100, 5), "max_tokens": 30, "stream": true})
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err) // its first token: it runs
	}
	got, waited := promptMS()
	if waited < 200*time.Millisecond {
		t.Fatalf("answered after %v: it did not wait for the slot", waited)
	}
	// The slot now holds the other prompt: all 20 tokens are computed again.
	if got != 22 {
		t.Errorf("after waiting %v: prompt_ms %v, want 22 (2 + 20 × 1)", waited, got)
	}
}

// TestCacheSaltPersonalities: each personality treats cache_salt as its
// engine does (docs/engines.md, "Cache salt"). Where the salt is kept, the
// same prompt under another salt hits nothing and under the same salt hits
// again; where it is ignored, another salt hits as the same one does;
// TensorRT-LLM's completions route refuses the field.
func TestCacheSaltPersonalities(t *testing.T) {
	tests := []struct {
		p                 Personality
		chat, completions saltUse
	}{
		{PersonalityVLLM, saltKept, saltKept},
		{PersonalitySGLang, saltKept, saltKept},
		{PersonalityTRTLLM, saltKept, saltRefused},
		{PersonalityLlamaCpp, saltIgnored, saltIgnored},
	}
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 30)
	for _, tt := range tests {
		for _, chat := range []bool{true, false} {
			route, want := "completions", tt.completions
			if chat {
				route, want = "chat", tt.chat
			}
			t.Run(tt.p.String()+" "+route, func(t *testing.T) {
				if got := tt.p.cacheSalt(chat); got != want {
					t.Fatalf("cacheSalt(%v) = %v, want %v", chat, got, want)
				}
				_, srv := newTestServer(t, Config{Engine: tt.p})
				send := func(salt string, status int) int {
					t.Helper()
					path, body := "/v1/completions", map[string]any{"prompt": text, "max_tokens": 2, "cache_salt": salt}
					if chat {
						path, body = "/v1/chat/completions", map[string]any{
							"messages": []map[string]string{{"role": "user", "content": text}}, "max_tokens": 2, "cache_salt": salt}
					}
					var c wireChunk
					postDecode(t, srv.URL+path, body, status, &c)
					if status != http.StatusOK {
						return 0
					}
					return c.Usage.cached(t)
				}
				if want == saltRefused {
					send("a", http.StatusBadRequest)
					return
				}
				send("a", http.StatusOK)
				same, other := send("a", http.StatusOK), send("b", http.StatusOK)
				t.Logf("cached: %d under the same salt, %d under another", same, other)
				if same == 0 {
					t.Fatalf("the same prompt under the same salt hit nothing")
				}
				if kept := other == 0; kept != (want == saltKept) {
					t.Errorf("another salt hit %d tokens (the same salt %d): want the salts kept apart %v", other, same, want == saltKept)
				}
			})
		}
	}
}
