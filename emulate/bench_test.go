package emulate

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkEmulatorStream measures streamed chat requests of 32 output
// tokens with zero delays, through a real HTTP client on loopback: the
// emulator's own cost per request, tokenization and SSE included.
func BenchmarkEmulatorStream(b *testing.B) {
	e, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()
	body, err := json.Marshal(chatBody("Explain prefix caching in two sentences.", map[string]any{
		"stream": true, "max_tokens": 32, "stream_options": map[string]any{"include_usage": true}}))
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || n == 0 {
				b.Errorf("status %d, %d bytes, %v", resp.StatusCode, n, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if st := e.Stats(); st.Success != int64(b.N) {
		b.Fatalf("%d successes for %d requests", st.Success, b.N)
	}
}

// BenchmarkPrefixCache looks up and inserts 2,048-token prompts that
// share half their tokens with the previous one, per personality.
func BenchmarkPrefixCache(b *testing.B) {
	for _, p := range []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityTRTLLM} {
		b.Run(p.String(), func(b *testing.B) {
			c := newPrefixCache(p, p.defaultBlockSize(), 1<<16, 0, true)
			prompts := make([][]int, 64)
			for i := range prompts {
				prompts[i] = cat(seq(0, 1024), seq(10_000+i*1024, 1024))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, cl := c.lookup("", prompts[i%len(prompts)])
				c.insert(cl)
				i++
			}
		})
	}
}
