package openai

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/config"
	"github.com/valyala/fasthttp"

	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// fastSender sends a target's requests with fasthttp's request writer and
// response parser, each request written and its answer read on the
// request's own goroutine, where net/http's transport hands every request
// to a writing and a reading goroutine of the connection and back: a cost
// a canary at thousands of requests a second pays in CPU
// (docs/benchmarks.md). It serves plain http targets with no
// authentication, proxy or extra headers (fastEligible); the others, and
// the retry on a new connection (Do), go through net/http.
//
// Its connections are dialed on the request's goroutine with the request's
// context, so that a cancellation ends a dial too, which fasthttp's own
// pool (HostClient) cannot do; idle ones wait in a short list.
type fastSender struct {
	addr    string        // host:port
	uri     *fasthttp.URI // the endpoint, copied into each request
	auth    string        // the Authorization header of the URL's userinfo; "" for none
	session string        // the session header's name; "" sends none
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)

	mu     sync.Mutex
	idle   []*fastConn // oldest first: a request takes the last one
	closed bool        // Close was called: a connection given back is closed
}

const (
	// fastReadBuffer holds a whole response header: a longer one is
	// refused (see docs/reliability.md). Engines send a few hundred bytes.
	fastReadBuffer = 16 << 10
	// fastWriteBuffer is net/http's: a small body goes out with its
	// headers in one write.
	fastWriteBuffer = 4 << 10
	// fastIdle is how long an idle connection is kept, as prometheus/common
	// keeps net/http's; fastMaxIdle how many, as its MaxIdleConnsPerHost.
	fastIdle    = 5 * time.Minute
	fastMaxIdle = 1000
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

func newFastSender(endpoint url.URL, user *url.Userinfo, sessionHeader string) *fastSender {
	f := &fastSender{addr: endpoint.Host, uri: fasthttp.AcquireURI(), dial: dialEngine, session: sessionHeader}
	if endpoint.Port() == "" {
		f.addr = net.JoinHostPort(endpoint.Hostname(), "80")
	}
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
	return f
}

// fastConn is one connection of the fast sender.
type fastConn struct {
	net.Conn
	dial     dialTimes // the dial's, for the phases of the first request
	used     bool      // a request has taken it before
	lastUsed time.Time // when it was last given back
}

// take gives the request a kept-alive connection, the most recently used,
// or dials a new one with the request's context.
func (f *fastSender) take(rctx context.Context) (*fastConn, error) {
	f.mu.Lock()
	if n := len(f.idle); n > 0 {
		fc := f.idle[n-1]
		f.idle[n-1] = nil
		f.idle = f.idle[:n-1]
		f.mu.Unlock()
		return fc, nil
	}
	f.mu.Unlock()
	fc := &fastConn{}
	c, err := f.dial(httptrace.WithClientTrace(rctx, fc.dial.trace(firstTime)), "tcp", f.addr)
	if err != nil {
		return nil, err
	}
	fc.Conn = c
	return fc, nil
}

// giveBack keeps fc for the next request, or closes it: after Close, past
// fastMaxIdle, or when reuse is false. Connections idle past fastIdle
// are closed on the way.
func (f *fastSender) giveBack(fc *fastConn, reuse bool) {
	if !reuse {
		_ = fc.Close()
		return
	}
	now := time.Now()
	fc.lastUsed = now
	var stale []*fastConn
	f.mu.Lock()
	keep := !f.closed && len(f.idle) < fastMaxIdle
	if keep {
		f.idle = append(f.idle, fc)
	}
	// Oldest first: the stale ones are a prefix.
	i := 0
	for i < len(f.idle) && now.Sub(f.idle[i].lastUsed) > fastIdle {
		i++
	}
	if i > 0 {
		stale = append(stale, f.idle[:i]...)
		n := copy(f.idle, f.idle[i:])
		clear(f.idle[n:])
		f.idle = f.idle[:n]
	}
	f.mu.Unlock()
	if !keep {
		_ = fc.Close()
	}
	for _, s := range stale {
		_ = s.Close()
	}
}

// close closes the idle connections; those in use are closed when given
// back.
func (f *fastSender) close() {
	f.mu.Lock()
	idle := f.idle
	f.idle, f.closed = nil, true
	f.mu.Unlock()
	for _, fc := range idle {
		_ = fc.Close()
	}
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

var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, fastReadBuffer) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, fastWriteBuffer) }}
)

// putReader gives br back to its pool, reading from nothing.
func putReader(br *bufio.Reader) {
	br.Reset(nil)
	readers.Put(br)
}

// send makes one attempt at the request (see Client.send, whose contract
// it keeps). The answer's body must be closed.
func (f *fastSender) send(rctx context.Context, body requestBody, session string, clock *phaseClock) (answer, bool, error) {
	fc, err := f.take(rctx)
	if err != nil {
		if e := rctx.Err(); e != nil {
			err = e
		}
		return answer{}, false, err
	}
	reused := fc.used
	if reused {
		clock.tookConn(nil)
	} else {
		fc.used = true
		clock.tookConn(&fc.dial)
	}
	b := &fastBody{f: f, fc: fc}
	// A canceled request (request_timeout, abandon.after, the workload's
	// end) unblocks whatever it waits for on the connection, which is then
	// never reused.
	b.stop = context.AfterFunc(rctx, b.interrupt)
	fail := func(err error, retry bool) (answer, bool, error) {
		b.stop()
		f.giveBack(fc, false)
		if e := rctx.Err(); e != nil {
			err = e // the cancellation is why, not the deadline it set
		}
		return answer{}, retry && rctx.Err() == nil, err
	}

	if err := f.write(rctx, fc, body, session); err != nil {
		return fail(err, reused)
	}
	clock.stamp(&clock.wrote)
	br := readers.Get().(*bufio.Reader) //nolint:forcetypeassert // the pool holds nothing else
	br.Reset(fc)
	if _, err := br.Peek(1); err != nil {
		putReader(br)
		return fail(err, reused)
	}
	clock.stamp(&clock.firstByte)
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = true
	resp.Header.SetNoDefaultContentType(true)
	if err := resp.Read(br); err != nil {
		fasthttp.ReleaseResponse(resp)
		putReader(br)
		var small *fasthttp.ErrSmallBuffer
		switch {
		case errors.As(err, &small):
			err = fmt.Errorf("the answer's headers are longer than %d KiB", fastReadBuffer>>10)
		case errors.Is(err, io.EOF):
			err = errors.New("the connection closed in the answer's headers: unexpected EOF")
		default:
			err = errors.New(withoutQuotedAnswer(err.Error()))
		}
		return fail(err, false)
	}
	b.resp, b.br = resp, br
	if b.stream = resp.BodyStream(); b.stream == nil {
		b.stream, b.eof = eofReader{}, true // a status without a body (204, 304)
	}
	return answer{status: resp.StatusCode(), contentType: string(resp.Header.ContentType()), body: b}, false, nil
}

// withoutQuotedAnswer cuts off the copy of the answer's bytes that
// fasthttp appends to a header error: the reason is enough for a log, and
// the bytes are the server's, which may echo a credential.
func withoutQuotedAnswer(msg string) string {
	for _, cut := range []string{": buffer size=", ": response \""} {
		if i := strings.Index(msg, cut); i >= 0 {
			msg = msg[:i]
		}
	}
	return msg
}

// write sends the request's headers and body on conn.
func (f *fastSender) write(rctx context.Context, conn net.Conn, body requestBody, session string) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	f.uri.CopyTo(req.URI())
	req.Header.SetContentTypeBytes(contentTypeJSONBytes)
	req.Header.SetBytesKV(acceptKey, acceptEventStreamBytes)
	req.Header.SetUserAgentBytes(userAgentBytes)
	tracing.InjectInto(rctx, fastHeaders{&req.Header})
	if f.session != "" && session != "" {
		req.Header.Set(f.session, sessionValue(session))
	}
	if f.auth != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, f.auth)
	}
	for _, p := range body {
		req.AppendBody(p)
	}
	bw := writers.Get().(*bufio.Writer) //nolint:forcetypeassert // the pool holds nothing else
	bw.Reset(conn)
	defer func() {
		bw.Reset(nil)
		writers.Put(bw)
	}()
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

// fastBody is a streamed answer's body, and the request's hold on its
// connection. Close may run while Read is blocked (drainAfterDone's
// timer): it then unblocks the read through the connection's deadline and
// waits for it before the buffers go back to their pools. The connection
// is reused only after a body read to its end, by a request that was not
// canceled.
type fastBody struct {
	mu     sync.Mutex // held by Read
	closed atomic.Bool
	f      *fastSender
	fc     *fastConn
	stop   func() bool // stops the cancellation's AfterFunc
	stream io.Reader
	eof    bool
	resp   *fasthttp.Response
	br     *bufio.Reader
}

// interrupt makes what waits on the connection return.
func (b *fastBody) interrupt() { _ = b.fc.SetDeadline(aLongTimeAgo) }

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
		b.interrupt()
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	canceled := !b.stop()
	reuse := b.eof && !interrupted && !canceled && !b.resp.ConnectionClose()
	_ = b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	putReader(b.br)
	b.f.giveBack(b.fc, reuse)
	return nil
}
