package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// counterPage writes a text-format page of the counters given, each
// "family{labels} value" line under its family's TYPE line.
func counterPage(lines ...string) string {
	var b strings.Builder
	typed := map[string]bool{}
	for _, line := range lines {
		family, _, _ := strings.Cut(line, "{")
		family, _, _ = strings.Cut(family, " ")
		if !typed[family] {
			fmt.Fprintf(&b, "# TYPE %s counter\n", family)
			typed[family] = true
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// scaled is the page of lines with every value multiplied by k: the
// counters' second read.
func scaled(t *testing.T, k float64, lines []string) []string {
	out := make([]string, len(lines))
	for i, line := range lines {
		head, v, _ := strings.Cut(line, " ")
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Errorf("line %q: %v", line, err)
		}
		out[i] = fmt.Sprintf("%s %g", head, k*x)
	}
	return out
}

// TestCachedCounterOrder: each engine's cached-token counter is read from
// the cleanest counter its page holds, and only where it lacks that one
// from the next. Each case's page is read twice, the second time with
// every counter doubled, so that the increase credited is the first
// read's values of the counter read.
func TestCachedCounterOrder(t *testing.T) {
	const (
		cached       = `vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 100`
		local        = `vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 110`
		localCompute = `vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 890`
		external     = `vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 0`
		recomputed   = `vllm:prompt_tokens_recomputed_total{engine="0",model_name="m"} 10`
		hits         = `vllm:prefix_cache_hits_total{engine="0",model_name="m"} 150`
		queries      = `vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000`
		// Fewer than the queries: a preempted request looked up again.
		prompt = `vllm:prompt_tokens_total{engine="0",model_name="m"} 900`
	)
	tests := []struct {
		name    string
		dialect Dialect
		page    []string
		// The counter read, the cached tokens credited, and the
		// recomputed tokens where the engine counts them; the prompt
		// tokens read with them (0: none).
		read                 string
		want, wantRecomputed float64
		recomputedKnown      bool
		wantPrompt           float64
	}{
		// vLLM since PR 33290, until PR 38709: every counter, hits 1.5
		// times the truth as issue 25780 makes them.
		{"vllm, every counter", DialectVLLM, []string{cached, local, localCompute, external, recomputed, hits, queries, prompt},
			"vllm:prompt_tokens_cached_total", 100, 10, true, 900},
		// vLLM since PR 38709: no recomputed counter, local_cache_hit
		// without them.
		{"vllm, no recomputed counter", DialectVLLM, []string{`vllm:prompt_tokens_cached_total 100`, `vllm:prompt_tokens_by_source_total{source="local_cache_hit"} 100`, hits, queries, prompt},
			"vllm:prompt_tokens_cached_total", 100, 0, false, 900},
		// A page without prompt_tokens_cached: local_cache_hit, less
		// the recomputed tokens it counts.
		{"vllm, by source", DialectVLLM, []string{local, localCompute, external, recomputed, hits, queries, prompt},
			`vllm:prompt_tokens_by_source_total{source="local_cache_hit"}`, 100, 10, true, 900},
		{"vllm, by source without recomputed", DialectVLLM, []string{local, localCompute, hits, prompt},
			`vllm:prompt_tokens_by_source_total{source="local_cache_hit"}`, 110, 0, false, 900},
		// The family without the local_cache_hit series says nothing of
		// the cache: the next counter is read.
		{"vllm, by source without its local series", DialectVLLM, []string{localCompute, external, hits, queries, prompt},
			"vllm:prefix_cache_hits_total", 150, 0, false, 1000},
		// prefix_cache_hits with the queries counted with it.
		{"vllm before PR 33290", DialectVLLM, []string{hits, queries, prompt}, "vllm:prefix_cache_hits_total", 150, 0, false, 1000},
		{"vllm, hits without _total", DialectVLLM, []string{`vllm:prefix_cache_hits 70`}, "vllm:prefix_cache_hits", 70, 0, false, 0},
		{"vllm, gpu_prefix_cache_hits", DialectVLLM, []string{`vllm:gpu_prefix_cache_hits_total 60`, `vllm:prompt_tokens_total 600`}, "vllm:gpu_prefix_cache_hits_total", 60, 0, false, 600},
		// SGLang with HiCache splits its count by cache_source: every
		// source is a cached token its usage counts.
		{"sglang by cache source", DialectSGLang, []string{`sglang:cached_tokens_total{cache_source="device",model_name="m"} 40`, `sglang:cached_tokens_total{cache_source="host",model_name="m"} 2`, `sglang:prompt_tokens_total{model_name="m"} 100`},
			"sglang:cached_tokens_total", 42, 0, false, 100},
		{"sglang", DialectSGLang, []string{`sglang:cached_tokens_total{model_name="m"} 7`}, "sglang:cached_tokens_total", 7, 0, false, 0},
		{"sglang, older name", DialectSGLang, []string{`sglang:cached_tokens{model_name="m"} 8`}, "sglang:cached_tokens", 8, 0, false, 0},
		{"trtllm", DialectTRTLLM, []string{`trtllm_prompt_cached_tokens_total 9`, `trtllm_prompt_cache_hit_tokens_total 90`}, "trtllm_prompt_cached_tokens_total", 9, 0, false, 0},
		{"trtllm, other name", DialectTRTLLM, []string{`trtllm_prompt_cache_hit_tokens_total 90`}, "trtllm_prompt_cache_hit_tokens_total", 90, 0, false, 0},
		{"llamacpp", DialectLlamaCpp, []string{`llamacpp:prompt_tokens_cached_total 12`, `llamacpp:prompt_tokens_total 88`}, "llamacpp:prompt_tokens_cached_total", 12, 0, false, 100},
		{"llamacpp, without _total", DialectLlamaCpp, []string{`llamacpp:prompt_tokens_cached 13`}, "llamacpp:prompt_tokens_cached", 13, 0, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var reads atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				page := tt.page
				if reads.Add(1) > 1 {
					page = scaled(t, 2, page)
				}
				fmt.Fprint(w, counterPage(page...))
			}))
			defer srv.Close()
			s := &ServerScraper{Target: "t", URL: srv.URL, Dialect: tt.dialect, Client: srv.Client()}
			var sk countsSink
			for range 2 {
				if err := s.ScrapeOnce(context.Background(), &sk); err != nil {
					t.Fatal(err)
				}
			}
			r, err := s.read(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := r.cachedFrom.String(); got != tt.read {
				t.Errorf("read %s, want %s", got, tt.read)
			}
			got := sk.got[1]
			if got.Cached != tt.want || got.Recomputed != tt.wantRecomputed || got.RecomputedKnown != tt.recomputedKnown {
				t.Errorf("credited %v cached, %v recomputed (known %v); want %v, %v (%v)",
					got.Cached, got.Recomputed, got.RecomputedKnown, tt.want, tt.wantRecomputed, tt.recomputedKnown)
			}
			if got.Prompt != tt.wantPrompt || got.PromptKnown != (tt.wantPrompt != 0) {
				t.Errorf("prompt %v (known %v), want %v", got.Prompt, got.PromptKnown, tt.wantPrompt)
			}
		})
	}
}

// TestCachedCounterSwitch: a page that stops holding the counter read
// and holds another (an engine upgraded behind a proxy that kept its
// process start time) credits nothing at the switch, never one counter's
// value less another's, and goes on from there.
func TestCachedCounterSwitch(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
	hits, cached := Series{Family: "vllm:prefix_cache_hits_total"}, Series{Family: vllmPromptTokensCached}
	key := func(c Series) string { return c.Family + "\xfd" }
	for i, step := range []struct {
		from  Series
		value float64
		want  float64
	}{
		{hits, 1000, 0},
		{hits, 1500, 500},
		{cached, 200, 0},
		{cached, 260, 60},
	} {
		got, err := s.counts(engineRead{cached: seriesValues{key(step.from): step.value}, cachedFrom: step.from, start: 1})
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if got.Cached != step.want {
			t.Errorf("read %d (%s %v): credited %v, want %v", i, step.from, step.value, got.Cached, step.want)
		}
	}
}

// TestRecomputedCounterHeldToTheRules: a recomputed-token counter that
// goes back with no restart refuses the read, as the other counters do.
func TestRecomputedCounterHeldToTheRules(t *testing.T) {
	s := &ServerScraper{Target: "t", Dialect: DialectVLLM}
	read := func(recomputed float64) error {
		_, err := s.counts(engineRead{cached: seriesValues{"c": 100}, recomputed: seriesValues{"r": recomputed}, start: 1})
		return err
	}
	if err := read(10); err != nil {
		t.Fatal(err)
	}
	err := read(5)
	if bad := (*RejectedCount)(nil); !errors.As(err, &bad) || bad.Counter != RecomputedCounter || bad.Reason != ServerErrorBackwards {
		t.Errorf("a recomputed counter gone back: %v, want refused as backwards", err)
	}
}
