package testutil

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// HangingServer answers nothing it holds: a request it holds waits until
// its client goes away, or until LetGo (then it is answered 404). It
// counts the requests it held and those it holds now. A target that
// accepts connections and never answers is what a wedged engine looks
// like to the exporter's reads.
type HangingServer struct {
	*httptest.Server
	release chan struct{}
	once    sync.Once

	mu                  sync.Mutex
	arrived, held, most int
}

// NewHangingServer starts a HangingServer that holds the requests hangs
// says it does (every one when hangs is nil) and answers the others 404
// at once. The test's cleanup lets every request go and closes it.
func NewHangingServer(t testing.TB, hangs func(*http.Request) bool) *HangingServer {
	t.Helper()
	h := &HangingServer{release: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hangs != nil && !hangs(r) {
			http.NotFound(w, r)
			return
		}
		// Read whole, a request's body lets the server see its client go
		// away: it watches the connection only from then on.
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.arrived++
		h.held++
		h.most = max(h.most, h.held)
		h.mu.Unlock()
		defer func() {
			h.mu.Lock()
			h.held--
			h.mu.Unlock()
		}()
		select {
		case <-h.release:
			http.NotFound(w, r)
		case <-r.Context().Done():
		}
	}))
	// Cleanups run last in, first out: the handlers end before Close
	// waits for them.
	t.Cleanup(h.Close)
	t.Cleanup(h.LetGo)
	return h
}

// LetGo answers every request held, and every later one, 404.
func (h *HangingServer) LetGo() { h.once.Do(func() { close(h.release) }) }

// Counts is how many requests it held in all, holds now, and held at
// most at once.
func (h *HangingServer) Counts() (arrived, held, most int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.arrived, h.held, h.most
}
