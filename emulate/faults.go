package emulate

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
)

// faultKind is the exclusive fault drawn for a request.
type faultKind int

const (
	faultNone faultKind = iota
	fault500
	fault429
	faultDisconnect
	faultMalformed
	faultHang
)

// faultState holds the fault probabilities and the seeded RNG. The RNG is
// shared by all requests, so a given arrival order replays the same
// faults.
type faultState struct {
	mu  sync.Mutex
	rng *rand.Rand
	f   Faults
}

// plan is what the draw decided for one request.
type plan struct {
	kind   faultKind
	slow   bool   // add faults.SlowFirstTokenDelay to the prefill
	faults Faults // the settings drawn from
}

// draw decides a request's faults: one uniform draw for the exclusive
// kinds, laid end to end on [0, 1), and one for the slow first token.
// Both draws happen whatever the probabilities, so changing one rate does
// not shift the others' sequence.
func (s *faultState) draw() plan {
	s.mu.Lock()
	u, v := s.rng.Float64(), s.rng.Float64()
	f := s.f
	s.mu.Unlock()
	p := plan{faults: f, slow: v < f.SlowFirstToken}
	for _, k := range []struct {
		kind faultKind
		p    float64
	}{{fault500, f.Error500}, {fault429, f.Error429}, {faultDisconnect, f.Disconnect},
		{faultMalformed, f.Malformed}, {faultHang, f.Hang}} {
		if u < k.p {
			p.kind = k.kind
			break
		}
		u -= k.p
	}
	return p
}

func (s *faultState) get() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f
}

func (s *faultState) set(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f = f
}

// cutAt returns after how many output tokens a disconnect or malformed
// fault strikes, or -1 for none.
func (p plan) cutAt(maxTokens int) int {
	if p.kind != faultDisconnect && p.kind != faultMalformed {
		return -1
	}
	if p.faults.AfterTokens == 0 {
		return maxTokens / 2
	}
	return min(p.faults.AfterTokens, maxTokens)
}

// hang sends the headers and waits for the client to leave (or the server
// to shut down, which cancels every request context).
func hang(ctx context.Context, w http.ResponseWriter, stream bool) {
	if stream {
		setSSEHeaders(w)
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	<-ctx.Done()
}

// disconnect closes the connection under the response, so the client
// sees the body cut short. HTTP/1 connections are hijacked and closed, and
// the handler must write nothing more; where hijacking is impossible
// (HTTP/2) it aborts the handler instead, which resets the stream.
// Streams flush every event, so nothing written is lost; a response not
// yet started ends without a status line.
func disconnect(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
