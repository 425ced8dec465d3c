package openai

import (
	"context"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/engine"
)

// TestHTTPPhases: a new connection's request goes through connect,
// request written and first byte (plain http to an address: no dns, no
// tls); the next one reuses the connection.
func TestHTTPPhases(t *testing.T) {
	for _, sender := range []string{"fasthttp", "net/http"} {
		t.Run(sender, func(t *testing.T) { testHTTPPhases(t, sender == "net/http") })
	}
}

func testHTTPPhases(t *testing.T, netHTTP bool) {
	srv := newHeaderServer(t)
	c := mustClient(t, TargetConfig{URL: srv.URL, Model: "m", Dialect: engine.DialectVLLM})
	if netHTTP {
		c.fast = nil
	}
	var first, second Response
	c.Do(context.Background(), Request{Prompt: "hello", MaxTokens: 4}, &first)
	c.Do(context.Background(), Request{Prompt: "hello", MaxTokens: 4}, &second)
	for _, res := range []*Response{&first, &second} {
		if res.Outcome != OutcomeSuccess {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Error)
		}
	}
	check := func(name string, p *HTTPPhases, want map[Phase]bool, reused bool) {
		t.Helper()
		if !p.GotConn || p.Reused != reused {
			t.Errorf("%s: got a connection %v, reused %v; want reused %v", name, p.GotConn, p.Reused, reused)
		}
		for _, ph := range Phases {
			d, ok := p.Took(ph)
			if ok != want[ph] || d < 0 {
				t.Errorf("%s: phase %s took %v, seen %v; want seen %v", name, ph, d, ok, want[ph])
			}
		}
	}
	check("first", &first.Phases, map[Phase]bool{PhaseConnect: true, PhaseWriteRequest: true, PhaseFirstByte: true}, false)
	check("second", &second.Phases, map[Phase]bool{PhaseWriteRequest: true, PhaseFirstByte: true}, true)
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("the test server is at %s: the phases above assume an address over plain http", srv.URL)
	}
}
