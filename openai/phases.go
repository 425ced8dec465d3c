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
// from its own goroutines: a dial's possibly after the attempt has taken
// another connection, and the write loop's request-written possibly after
// the answer's first byte was read. Hence the lock, and durations worked
// out only once the request is over (phases).
type phaseClock struct {
	mu                        sync.Mutex
	dial                      dialTimes
	tlsStart, tlsDone         time.Time
	gotConn, wrote, firstByte time.Time
	gotConnection, reused     bool
}

// trace is the ClientTrace that feeds c.
func (c *phaseClock) trace() *httptrace.ClientTrace {
	at := func(t *time.Time) {
		c.mu.Lock()
		firstTime(t)
		c.mu.Unlock()
	}
	t := c.dial.trace(at)
	t.TLSHandshakeStart = func() { at(&c.tlsStart) }
	t.TLSHandshakeDone = func(_ tls.ConnectionState, err error) {
		if err == nil {
			at(&c.tlsDone)
		}
	}
	t.GotConn = func(i httptrace.GotConnInfo) {
		c.mu.Lock()
		c.gotConn = time.Now()
		// Any reused connection counts, not only one taken from the
		// idle pool (see send).
		c.gotConnection, c.reused = true, i.Reused
		c.mu.Unlock()
	}
	t.WroteRequest = func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			at(&c.wrote)
		}
	}
	t.GotFirstResponseByte = func() { at(&c.firstByte) }
	return t
}

// dialTimes are a new connection's DNS and connect times, taken by the
// fast sender's dial and handed to the phaseClock of the request that
// dialed it.
type dialTimes struct {
	dnsStart, dnsDone, connectStart, connectDone time.Time
}

// trace is the ClientTrace of a dial: each hook records its time in d
// through at.
func (d *dialTimes) trace(at func(*time.Time)) *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		DNSStart: func(httptrace.DNSStartInfo) { at(&d.dnsStart) },
		DNSDone: func(i httptrace.DNSDoneInfo) {
			if i.Err == nil {
				at(&d.dnsDone)
			}
		},
		ConnectStart: func(string, string) { at(&d.connectStart) },
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				at(&d.connectDone)
			}
		},
	}
}

// firstTime sets *t to now unless it is set: a later dial of the same
// attempt does not count. For a dial's own goroutine, without a lock.
func firstTime(t *time.Time) {
	if t.IsZero() {
		*t = time.Now()
	}
}

// tookConn records the connection the fast sender took, with the dial's
// times when it is a new one (d nil for a reused one).
func (c *phaseClock) tookConn(d *dialTimes) {
	now := time.Now()
	c.mu.Lock()
	if d != nil {
		c.dial = *d
	}
	c.gotConnection, c.reused, c.gotConn = true, d == nil, now
	c.mu.Unlock()
}

// stamp records now in t, which the fast sender passes as &c.wrote or
// &c.firstByte.
func (c *phaseClock) stamp(t *time.Time) {
	now := time.Now()
	c.mu.Lock()
	*t = now
	c.mu.Unlock()
}

// failedOnReused tells whether the attempt had a reused connection and no
// byte of an answer (see send). The first byte's hook runs before the
// transport hands the answer over, so it is known when Do returns.
func (c *phaseClock) failedOnReused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reused && c.firstByte.IsZero()
}

// phases works out the attempt's phases; call it once the request is over.
func (c *phaseClock) phases() HTTPPhases {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := HTTPPhases{GotConn: c.gotConnection, Reused: c.reused}
	set := func(p Phase, from, to time.Time) {
		if !from.IsZero() && !to.IsZero() {
			// The request-written hook may run after the first byte's,
			// though the write ended before: that is a zero wait.
			h.took[p], h.seen[p] = max(to.Sub(from), 0), true
		}
	}
	set(PhaseDNS, c.dial.dnsStart, c.dial.dnsDone)
	set(PhaseConnect, c.dial.connectStart, c.dial.connectDone)
	set(PhaseTLS, c.tlsStart, c.tlsDone)
	set(PhaseWriteRequest, c.gotConn, c.wrote)
	set(PhaseFirstByte, c.wrote, c.firstByte)
	return h
}
