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
