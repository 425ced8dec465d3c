package testutil

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestFakeServerStream: a streamed request gets its tokens and usage, a
// request that does not ask for a stream is refused, and the counts say
// what arrived.
func TestFakeServerStream(t *testing.T) {
	f := NewFakeServer(t, func(f *FakeServer) {
		f.Usage = func(n int) Usage { return Usage{Prompt: 7, Completion: n, Cached: 3} }
		f.Metrics = VLLMMetrics
	})
	req, _ := http.NewRequest(http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(`{"stream": true, "max_tokens": 2}`))
	req.Header.Set("Authorization", "Bearer x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			events = append(events, line)
		}
	}
	resp.Body.Close()
	if len(events) != 5 || !strings.Contains(events[0], `"role":"assistant"`) || strings.Count(strings.Join(events, ""), `" tok"`) != 2 ||
		!strings.Contains(events[3], `"prompt_tokens":7`) || !strings.Contains(events[3], `"cached_tokens":3`) || events[4] != "data: [DONE]" {
		t.Errorf("stream:\n%s", strings.Join(events, "\n"))
	}
	resp, err = http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"max_tokens": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a request without stream: %s, want 400", resp.Status)
	}
	if mfs := Scrape(t, f.URL); mfs.Sum("vllm:prefix_cache_hits_total") != 0 || len(mfs) != 1 {
		t.Errorf("/metrics: %v", mfs)
	}
	if f.Requests() != 1 || f.Count("/v1/chat/completions") != 1 || f.Count("/metrics") != 1 || f.Auth("Bearer x") != 1 {
		t.Errorf("requests %d, by path %v, auth %v", f.Requests(), f.byPath, f.auth)
	}
}

// TestFakeServerRelease: a held request is answered once released, and one
// whose client goes away is counted as ended.
func TestFakeServerRelease(t *testing.T) {
	f := NewFakeServer(t, func(f *FakeServer) { f.Release = make(chan struct{}) })
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/v1/chat/completions", strings.NewReader(`{"stream": true, "max_tokens": 1}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	Eventually(t, "the request held", func() (bool, string) { return f.Requests() == 1, fmt.Sprint(f.Requests()) })
	cancel()
	if err := Wait(t, "the client gone", gone); err == nil {
		t.Error("a canceled request got an answer")
	}
	Eventually(t, "the held request ended", func() (bool, string) { return f.Ended() == 1, fmt.Sprint(f.Ended()) })

	answered := make(chan int, 1)
	go func() {
		resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream": true, "max_tokens": 1}`))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	Eventually(t, "the second request held", func() (bool, string) { return f.Requests() == 2, fmt.Sprint(f.Requests()) })
	f.Release <- struct{}{}
	if code := Wait(t, "the released answer", answered); code != http.StatusOK {
		t.Errorf("released: %d, want 200", code)
	}
}
