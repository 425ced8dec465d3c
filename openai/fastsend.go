package openai

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/config"
	"github.com/valyala/fasthttp"

	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// fastSender sends a target's requests with fasthttp: each request is
// written and its answer read on the request's own goroutine, where
// net/http's transport hands every request to a writing and a reading
// goroutine of the connection and back, a cost a canary at thousands of
// requests a second pays in CPU (docs/benchmarks.md). It serves plain
// http targets with no authentication, proxy or extra headers
// (fastEligible); the others, and the retry on a new connection (Do), go
// through net/http. Connections are pooled by fasthttp's HostClient.
type fastSender struct {
	hc   *fasthttp.HostClient
	uri  *fasthttp.URI // the endpoint, copied into each request
	auth string        // the Authorization header of the URL's userinfo; "" for none
}

const (
	// fastReadBuffer holds a whole response header: a longer one is
	// refused (see docs/reliability.md). Engines send a few hundred bytes.
	fastReadBuffer = 16 << 10
	// fastWriteBuffer is net/http's: a small body goes out with its
	// headers in one write.
	fastWriteBuffer = 4 << 10
	// fastIdle is how long an idle connection is kept, as prometheus/common
	// keeps net/http's.
	fastIdle = 5 * time.Minute
	// fastDialTimeout bounds a dial when the request has no deadline.
	fastDialTimeout = 30 * time.Second
)

// fastEligible reports whether a target's requests may go through the
// fast sender: plain http, and nothing in http_client_config that
// net/http's round tripper would act on for such a URL.
func fastEligible(endpoint url.URL, hc config.HTTPClientConfig) bool {
	if endpoint.Scheme != "http" {
		return false
	}
	// Meaningless for plain http, or not done anyway (redirects).
	hc.FollowRedirects, hc.EnableHTTP2, hc.TLSConfig = false, false, config.TLSConfig{}
	return reflect.DeepEqual(hc, config.HTTPClientConfig{})
}

func newFastSender(endpoint url.URL, user *url.Userinfo) *fastSender {
	addr := endpoint.Host
	if endpoint.Port() == "" {
		addr = net.JoinHostPort(endpoint.Hostname(), "80")
	}
	f := &fastSender{uri: fasthttp.AcquireURI()}
	if err := f.uri.Parse(nil, []byte(endpoint.String())); err != nil {
		// setEndpoint parsed it already; fasthttp takes what net/url takes.
		panic("fasthttp cannot parse the endpoint: " + err.Error())
	}
	f.uri.DisablePathNormalizing = true
	if user != nil {
		r := http.Request{Header: http.Header{}}
		p, _ := user.Password()
		r.SetBasicAuth(user.Username(), p)
		f.auth = r.Header.Get("Authorization")
	}
	f.hc = &fasthttp.HostClient{
		Addr:                     addr,
		DialTimeout:              dialFast,
		MaxConns:                 math.MaxInt32, // max_in_flight bounds them
		MaxIdleConnDuration:      fastIdle,
		ReadBufferSize:           fastReadBuffer,
		WriteBufferSize:          fastWriteBuffer,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
	}
	return f
}

// fastConn is a connection the fast sender dialed, with the dial's times
// for the phases of the request that takes it first.
type fastConn struct {
	net.Conn
	dial dialTimes
	used bool // set by the first request that took it
}

// dialFast dials as the net/http path does (dialEngine), timing the DNS
// lookup and the connection.
func dialFast(addr string, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = fastDialTimeout
	}
	fc := &fastConn{}
	ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), fc.dial.trace()), timeout)
	defer cancel()
	c, err := dialEngine(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	fc.Conn = c
	return fc, nil
}

// fastHeaders lets the trace context be written into a fasthttp request.
type fastHeaders struct{ h *fasthttp.RequestHeader }

func (f fastHeaders) Get(key string) string { return string(f.h.Peek(key)) }
func (f fastHeaders) Set(key, value string) { f.h.Set(key, value) }
func (f fastHeaders) Keys() []string {
	var keys []string
	for k := range f.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// aLongTimeAgo is a deadline that makes a blocked read or write return.
var aLongTimeAgo = time.Unix(1, 0)

// send makes one attempt at the request (see Client.send, whose contract
// it keeps). The answer's body must be closed.
func (f *fastSender) send(rctx context.Context, c *Client, body requestBody, session string, clock *phaseClock) (answer, bool, error) {
	if err := rctx.Err(); err != nil {
		return answer{}, false, err
	}
	var wait time.Duration
	if d, ok := rctx.Deadline(); ok {
		wait = max(time.Until(d), time.Nanosecond)
	}
	cc, err := f.hc.AcquireConn(wait, false)
	if err != nil {
		return answer{}, false, err
	}
	conn := cc.Conn()
	reused := true
	if fc, ok := conn.(*fastConn); ok && !fc.used {
		fc.used, reused = true, false
		clock.tookConn(&fc.dial)
	} else {
		clock.tookConn(nil)
	}
	// A canceled request (request_timeout, abandon.after, the workload's
	// end) unblocks whatever it waits for on the connection, which is then
	// never reused.
	stop := context.AfterFunc(rctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	release := func(reuse bool) {
		if reuse {
			f.hc.ReleaseConn(cc)
		} else {
			f.hc.CloseConn(cc)
		}
	}
	fail := func(err error, retry bool) (answer, bool, error) {
		stop()
		release(false)
		if e := rctx.Err(); e != nil {
			err = e // the cancellation is why, not the deadline it set
		}
		return answer{}, retry && rctx.Err() == nil, err
	}

	if err := f.write(rctx, conn, c, body, session); err != nil {
		return fail(err, reused)
	}
	clock.stamp(&clock.wrote)
	br := f.hc.AcquireReader(conn)
	if _, err := br.Peek(1); err != nil {
		f.hc.ReleaseReader(br)
		return fail(err, reused)
	}
	clock.stamp(&clock.firstByte)
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = true
	resp.Header.SetNoDefaultContentType(true)
	if err := resp.Read(br); err != nil {
		fasthttp.ReleaseResponse(resp)
		f.hc.ReleaseReader(br)
		var small *fasthttp.ErrSmallBuffer
		switch {
		case errors.As(err, &small):
			err = fmt.Errorf("the answer's headers are longer than %d KiB", fastReadBuffer>>10)
		case errors.Is(err, io.EOF):
			// fasthttp's text would quote the answer's bytes.
			err = errors.New("the connection closed in the answer's headers: unexpected EOF")
		}
		return fail(err, false)
	}
	b := &fastBody{resp: resp, br: br, conn: conn, stop: stop, release: release, hc: f.hc}
	if b.stream = resp.BodyStream(); b.stream == nil {
		b.stream, b.eof = eofReader{}, true // a status without a body (204, 304)
	}
	return answer{status: resp.StatusCode(), contentType: string(resp.Header.ContentType()), body: b}, false, nil
}

// write sends the request's headers and body on conn.
func (f *fastSender) write(rctx context.Context, conn net.Conn, c *Client, body requestBody, session string) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	f.uri.CopyTo(req.URI())
	req.Header.SetContentTypeBytes(contentTypeJSONBytes)
	req.Header.SetBytesKV(acceptKey, acceptEventStreamBytes)
	req.Header.SetUserAgentBytes(userAgentBytes)
	tracing.InjectInto(rctx, fastHeaders{&req.Header})
	if c.session != "" && session != "" {
		req.Header.Set(c.session, sessionValue(session))
	}
	if f.auth != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, f.auth)
	}
	for _, p := range body {
		req.AppendBody(p)
	}
	bw := f.hc.AcquireWriter(conn)
	defer f.hc.ReleaseWriter(bw)
	if err := req.Write(bw); err != nil {
		return err
	}
	return bw.Flush()
}

var (
	contentTypeJSONBytes   = []byte(contentTypeJSON[0])
	acceptKey              = []byte("Accept")
	acceptEventStreamBytes = []byte(acceptEventStream[0])
	userAgentBytes         = []byte(userAgent[0])
)

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// errBodyClosed is what a read of a closed body returns.
var errBodyClosed = errors.New("read on a closed response body")

// fastBody is a streamed answer's body. Close may run while Read is
// blocked (drainAfterDone's timer): it then unblocks the read through the
// connection's deadline and waits for it before the buffers go back to
// their pools. The connection is reused only after a body read to its
// end, by a request that was not canceled.
type fastBody struct {
	mu      sync.Mutex // held by Read
	closed  atomic.Bool
	stream  io.Reader
	eof     bool
	resp    *fasthttp.Response
	br      *bufio.Reader
	conn    net.Conn
	hc      *fasthttp.HostClient
	stop    func() bool
	release func(reuse bool)
}

func (b *fastBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errBodyClosed
	}
	n, err := b.stream.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

func (b *fastBody) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	interrupted := false
	if !b.mu.TryLock() {
		interrupted = true
		_ = b.conn.SetReadDeadline(aLongTimeAgo)
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	canceled := !b.stop()
	reuse := b.eof && !interrupted && !canceled && !b.resp.ConnectionClose()
	_ = b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	b.hc.ReleaseReader(b.br)
	b.release(reuse)
	return nil
}
