package openai

import (
	"crypto/tls"
	"net/http/httptrace"
	"sync"
	"time"
)

// Phase is one step of an HTTP request before its answer, as
// net/http/httptrace sees it.
type Phase uint8

// The phases, in the order a request goes through them (label values of
// kvload_http_phase_seconds). A request on a reused connection has no dns,
// connect or tls; plain http has no tls; an address has no dns.
const (
	PhaseDNS          Phase = iota // the name's lookup
	PhaseConnect                   // the TCP connection, from the first dial to the one that succeeded
	PhaseTLS                       // the TLS handshake
	PhaseWriteRequest              // from having a connection to the request written, body included
	PhaseFirstByte                 // from the request written to the first byte of the answer (its headers)
	phaseCount
)

// Phases lists every phase, for initialising series.
var Phases = [...]Phase{PhaseDNS, PhaseConnect, PhaseTLS, PhaseWriteRequest, PhaseFirstByte}

var phaseNames = [phaseCount]string{"dns", "connect", "tls", "write_request", "first_byte"}

func (p Phase) String() string { return phaseNames[p] }

// HTTPPhases is how long each phase of a request's last attempt took, and
// the connection it went out on.
type HTTPPhases struct {
	took [phaseCount]time.Duration
	seen [phaseCount]bool
	// GotConn: the attempt had a connection; Reused: a kept-alive one.
	GotConn, Reused bool
}

// Took is how long phase p took; ok is false when the request did not go
// through it.
func (h *HTTPPhases) Took(p Phase) (d time.Duration, ok bool) {
	return h.took[p], h.seen[p]
}

// phaseClock times one attempt's phases. The transport calls its hooks
// from its own goroutines, a dial's possibly after the attempt has taken
// another connection and ended: hence the lock, and the copy taken once.
type phaseClock struct {
	mu                                        sync.Mutex
	dnsStart, connectStart, tlsStart, gotConn time.Time
	wrote                                     time.Time
	phases                                    HTTPPhases
	responded                                 bool
}

func (c *phaseClock) set(p Phase, since time.Time) {
	if since.IsZero() || c.phases.seen[p] {
		return
	}
	c.phases.took[p], c.phases.seen[p] = time.Since(since), true
}

// trace is the ClientTrace that feeds c.
func (c *phaseClock) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		DNSStart: func(httptrace.DNSStartInfo) { c.mu.Lock(); c.dnsStart = time.Now(); c.mu.Unlock() },
		DNSDone: func(i httptrace.DNSDoneInfo) {
			c.mu.Lock()
			if i.Err == nil {
				c.set(PhaseDNS, c.dnsStart)
			}
			c.mu.Unlock()
		},
		ConnectStart: func(string, string) {
			c.mu.Lock()
			if c.connectStart.IsZero() {
				c.connectStart = time.Now()
			}
			c.mu.Unlock()
		},
		ConnectDone: func(_, _ string, err error) {
			c.mu.Lock()
			if err == nil {
				c.set(PhaseConnect, c.connectStart)
			}
			c.mu.Unlock()
		},
		TLSHandshakeStart: func() { c.mu.Lock(); c.tlsStart = time.Now(); c.mu.Unlock() },
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
			c.mu.Lock()
			if err == nil {
				c.set(PhaseTLS, c.tlsStart)
			}
			c.mu.Unlock()
		},
		GotConn: func(i httptrace.GotConnInfo) {
			c.mu.Lock()
			c.gotConn = time.Now()
			// Any reused connection counts, not only one taken from the
			// idle pool (see send).
			c.phases.GotConn, c.phases.Reused = true, i.Reused
			c.mu.Unlock()
		},
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			c.mu.Lock()
			if i.Err == nil {
				c.set(PhaseWriteRequest, c.gotConn)
				c.wrote = time.Now()
			}
			c.mu.Unlock()
		},
		GotFirstResponseByte: func() {
			c.mu.Lock()
			c.responded = true
			c.set(PhaseFirstByte, c.wrote)
			c.mu.Unlock()
		},
	}
}

// result is the attempt's phases so far, and whether it failed on a
// reused connection before any answer (see send).
func (c *phaseClock) result() (HTTPPhases, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.phases, c.phases.Reused && !c.responded
}
