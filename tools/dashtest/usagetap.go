package dashtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// usageTap is a reverse proxy in front of an engine that reads the usage
// of every streamed answer it passes on, so that a test can hold the
// exporter's counters against what the engine itself answered, read by
// code the exporter does not share. Only answers that end with [DONE]
// count: the exporter counts no other.
type usageTap struct {
	proxy *httputil.ReverseProxy

	mu       sync.Mutex
	closed   bool
	inFlight sync.WaitGroup
	answers  []tapAnswer
}

// tapAnswer is one answer a tap passed on whole: when it ended, and its
// usage.
type tapAnswer struct {
	at    time.Time
	usage streamUsage
}

// usageTotals are the usage of the answers a tap passed on whole.
type usageTotals struct {
	answers    int // 200 answers that ended with [DONE] after a usage
	prompt     int // their usage.prompt_tokens
	cached     int // their usage.prompt_tokens_details.cached_tokens
	unreported int // answers whose usage had no cached_tokens
}

// newUsageTap serves a tap in front of target (host:port) on a free local
// address, until the test ends.
func newUsageTap(t *testing.T, target string) (*usageTap, string) {
	t.Helper()
	to := &url.URL{Scheme: "http", Host: target}
	tap := &usageTap{}
	tap.proxy = &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(to) },
		FlushInterval:  -1, // every chunk as it comes: TTFT stays the engine's
		ModifyResponse: tap.watch,
		// The exporter counts the requests the engine failed.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv := httptest.NewServer(tap)
	t.Cleanup(srv.Close)
	return tap, strings.TrimPrefix(srv.URL, "http://")
}

func (p *usageTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		http.Error(w, "tap closed", http.StatusServiceUnavailable)
		return
	}
	p.inFlight.Add(1)
	p.mu.Unlock()
	defer p.inFlight.Done()
	p.proxy.ServeHTTP(w, r)
}

// watch reads the body of a 200 answer as the proxy copies it.
func (p *usageTap) watch(resp *http.Response) error {
	if resp.StatusCode == http.StatusOK {
		resp.Body = &tappedBody{ReadCloser: resp.Body, tap: p}
	}
	return nil
}

// close refuses every request from now on and waits for those it passes
// on to end: its answers are then every one the exporter can count.
func (p *usageTap) close() []tapAnswer {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.inFlight.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.answers
}

// sum totals the answers that ended in [from, to).
func sum(answers []tapAnswer, from, to time.Time) usageTotals {
	var s usageTotals
	for _, a := range answers {
		if !a.at.Before(from) && a.at.Before(to) {
			s.add(a.usage)
		}
	}
	return s
}

// hitRate is the share of the prompt tokens that the answers said were
// cached.
func (s usageTotals) hitRate() float64 { return float64(s.cached) / float64(s.prompt) }

// tappedBody passes an answer's bytes on and reads its SSE data lines.
type tappedBody struct {
	io.ReadCloser
	tap    *usageTap
	stream usageStream
	once   sync.Once
}

func (b *tappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.stream.write(p[:n])
	return n, err
}

func (b *tappedBody) Close() error {
	b.once.Do(func() {
		if u, ok := b.stream.final(); ok {
			b.tap.mu.Lock()
			b.tap.answers = append(b.tap.answers, tapAnswer{at: time.Now(), usage: u})
			b.tap.mu.Unlock()
		}
	})
	return b.ReadCloser.Close()
}

func (s *usageTotals) add(u streamUsage) {
	s.answers++
	s.prompt += u.PromptTokens
	if u.Details != nil && u.Details.CachedTokens != nil {
		s.cached += *u.Details.CachedTokens
	} else {
		s.unreported++
	}
}

// streamUsage is the usage object of an OpenAI-shaped stream chunk.
type streamUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// maxTapLine bounds the line a usageStream keeps: a chunk of a few
// generated tokens is far shorter.
const maxTapLine = 1 << 20

// usageStream reads an SSE body fed in pieces of any size: the last usage
// of its data lines, and whether it ended with [DONE].
type usageStream struct {
	line    []byte
	long    bool // the line in progress passed maxTapLine
	usage   *streamUsage
	done    bool
	badLine error
}

func (s *usageStream) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.keep(p)
			return
		}
		s.keep(p[:i])
		s.endLine()
		p = p[i+1:]
	}
}

func (s *usageStream) keep(p []byte) {
	if len(s.line)+len(p) > maxTapLine {
		s.long = true
		return
	}
	s.line = append(s.line, p...)
}

func (s *usageStream) endLine() {
	line, long := bytes.TrimRight(s.line, "\r"), s.long
	s.line, s.long = s.line[:0], false
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	switch {
	case s.done:
		s.badLine = errors.New("data after [DONE]")
	case long:
		s.badLine = errors.New("data line too long")
	case string(data) == "[DONE]":
		s.done = true
	default:
		var chunk struct {
			Usage *streamUsage `json:"usage"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			s.badLine = err
			return
		}
		if chunk.Usage != nil {
			s.usage = chunk.Usage
		}
	}
}

// final is the stream's last usage, when the stream ended with [DONE]
// and every data line before it was a JSON chunk.
func (s *usageStream) final() (streamUsage, bool) {
	if !s.done || s.usage == nil || s.badLine != nil {
		return streamUsage{}, false
	}
	return *s.usage, true
}
