package openai

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/common/config"
	"github.com/valyala/fastjson"
	"go.opentelemetry.io/otel/attribute"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// TargetConfig is what the client needs of one configured target.
type TargetConfig struct {
	Name  string
	URL   string // base URL without /v1; may carry query parameters
	Model string // sent as "model"; omitted when empty

	API          API            // chat | completions; empty means chat
	Dialect      engine.Dialect // empty means openai
	PromptFormat PromptFormat   // text | token_ids; empty means text

	// RequestTimeout bounds one request from send to the end of its
	// stream; 0 leaves it to the caller's context.
	RequestTimeout   time.Duration
	HTTPClientConfig config.HTTPClientConfig
	ExtraBody        map[string]any // merged into every request body
	// SessionHeader, when set, names the header that carries each
	// request's Session, for a router that keeps a session on one replica.
	SessionHeader string
	// CacheSalt, when set, goes in every request body, in the field the
	// dialect takes it in on the API, so that the engine shares cached
	// prefixes only among requests with this salt. A dialect that takes
	// none there is an error.
	CacheSalt string
	// Tracer gives each request its traceparent and, where it exports,
	// its span; the daemon replaces the tracer it holds at a reload. nil
	// sends a sampled traceparent and builds no span.
	Tracer *tracing.Current
	// Workload names the workload whose requests the client sends, on
	// each span (kvload.workload); empty names none.
	Workload string
}

// Client streams completions from one target and measures them. It is safe
// for concurrent use; one Client serves every request to its target.
type Client struct {
	api      API
	spec     *engine.Spec
	endpoint url.URL // without userinfo; copied into each request
	user     *url.Userinfo
	timeout  time.Duration
	http     http.RoundTripper
	fresh    http.RoundTripper // without keep-alive: a new connection per request
	fast     *fastSender       // nil: every attempt goes through http
	model    []byte            // JSON string, nil when no model is configured
	session  string            // the session header's name; "" sends none
	extra    []bodyField       // extra_body, encoded once
	salt     *bodyField        // the cache salt, set last; nil sends none
	secrets  []string          // inline credentials, scrubbed from error texts
	// extraSetsLength: extra_body holds one of lengthKeys, so max_tokens
	// does not bound the output (see limitsFor).
	extraSetsLength bool
	// secretFiles hold credentials (credentials_file, password_file, ...)
	// that prometheus/common reads on every request, so that they can be
	// rotated: scrub reads them too, or a server echoing the token in its
	// error body would put it in the log.
	secretFiles []string

	tracer    *tracing.Current // nil: tracing.DefaultTracer
	spanName  string           // the gen_ai convention's "{operation} {model}"
	spanAttrs []attribute.KeyValue

	streams sync.Pool // *streamParser, reused across requests

	// cachedReported is set once any response from this target carried
	// usage.prompt_tokens_details.cached_tokens. For dialects that omit
	// the field when it is zero, it tells "zero" from "not reported".
	cachedReported atomic.Bool
}

// streamParser bundles the per-stream buffers so a request reuses them.
type streamParser struct {
	sse   sseReader
	state streamState
	grace graceCloser
}

// graceCloser closes a body doneGrace after [DONE] (see drainAfterDone).
// Its timer is made once per parser and reset for each stream, which saves
// a request the allocations of an AfterFunc, its closure and a channel.
type graceCloser struct {
	t      *time.Timer
	body   io.Closer     // set before the timer is reset, read when it fires
	closed chan struct{} // one value each time the timer has closed body
}

func (g *graceCloser) fire() {
	_ = g.body.Close()
	g.closed <- struct{}{}
}

const (
	maxErrorBody = 64 << 10 // the part of an error response read for its message
	maxDrain     = 64 << 10 // read after [DONE] so the connection can be reused
	// doneGrace bounds the wait for the end of the body after [DONE]
	// (see drainAfterDone): ample for a last chunk already on its way.
	doneGrace    = 20 * time.Millisecond
	maxErrorText = 300 // Response.Error is for logs: keep it short
)

// Header values every request shares. Each slice is full (length equals
// capacity), so a round tripper that adds to one of these headers gets a
// new array and never writes into the shared one.
var (
	contentTypeJSON   = []string{"application/json"}
	acceptEventStream = []string{"text/event-stream"}
	userAgent         = []string{"kvload-exporter"}
)

// errRequestTimeout is the cause of the per-request deadline, telling it
// apart from a deadline of the caller's context.
var errRequestTimeout = errors.New("request timeout")

// errAbandoned is the cause of the deadline of Request.Abandon.After.
var errAbandoned = errors.New("abandoned")

// New validates cfg and builds its HTTP client. Outbound auth, TLS and
// proxy come from cfg.HTTPClientConfig via prometheus/common; its transport
// keeps connections alive with MaxIdleConnsPerHost 1000 (MaxIdleConns
// 20000), enough for hundreds of concurrent streams to one target without
// re-dialling. A plain http target that needs none of it is sent its
// requests through fasthttp instead (fastSender).
func New(cfg TargetConfig) (*Client, error) {
	var errs []error
	c := &Client{api: cfg.API, timeout: cfg.RequestTimeout}
	if c.api == "" {
		c.api = APIChat
	}
	if c.api != APIChat && c.api != APICompletions {
		errs = append(errs, fmt.Errorf("api %q: want chat or completions", cfg.API))
	}
	if cfg.Dialect != "" && !engine.Known(cfg.Dialect) {
		errs = append(errs, fmt.Errorf("dialect %q: want one of %v", cfg.Dialect, engine.Dialects))
	}
	c.spec = engine.For(cfg.Dialect)
	switch cfg.PromptFormat {
	case "", PromptFormatText:
	case PromptFormatTokenIDs:
		if c.api != APICompletions {
			errs = append(errs, errors.New("prompt_format token_ids needs api completions"))
		}
	default:
		errs = append(errs, fmt.Errorf("prompt_format %q: want text or token_ids", cfg.PromptFormat))
	}
	if cfg.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("request_timeout %v is negative", cfg.RequestTimeout))
	}
	if cfg.SessionHeader != "" {
		if err := CheckSessionHeader(cfg.SessionHeader); err != nil {
			errs = append(errs, fmt.Errorf("session_header: %w", err))
		}
		c.session = cfg.SessionHeader
	}
	if err := c.setEndpoint(cfg.URL); err != nil {
		errs = append(errs, err)
	}
	if cfg.Model != "" {
		c.model = appendJSONString(nil, cfg.Model)
	}
	if cfg.CacheSalt != "" {
		if field := c.spec.CacheSaltField(c.api == APIChat); field == "" {
			errs = append(errs, fmt.Errorf("cache salt: dialect %s takes none on %s", c.spec.Dialect, c.api))
		} else {
			c.salt = &bodyField{key: field, val: appendJSONString(nil, cfg.CacheSalt)}
		}
	}
	extra, err := encodeExtraBody(cfg.ExtraBody)
	if err != nil {
		errs = append(errs, err)
	}
	c.extra = extra
	for _, f := range extra {
		c.extraSetsLength = c.extraSetsLength || slices.Contains(lengthKeys, f.key)
	}
	hc := cfg.HTTPClientConfig
	if err := hc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("http_client_config: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.tracer = cfg.Tracer
	c.spanName, c.spanAttrs = spanStatic(cfg, c.api, c.spec.Dialect, c.endpoint.String())
	c.secrets = inlineSecrets(&hc, c.user)
	c.secretFiles = secretFiles(&hc)
	// Round trippers, not http.Client: a request needs no redirect
	// following (an inference endpoint has no reason to redirect, so a 3xx
	// is reported as the http_error it is), no cookie jar and no timeout
	// of the client's own, and http.Client would copy every request's
	// headers for the redirect that never comes.
	c.http, err = config.NewRoundTripperFromConfig(hc, cfg.Name, transportOptions()...)
	if err != nil {
		return nil, fmt.Errorf("http_client_config: %w", err)
	}
	// The retry after a stale kept-alive connection (see Do) must not take
	// another one from the pool, which may be as stale.
	c.fresh, err = config.NewRoundTripperFromConfig(hc, cfg.Name, append(transportOptions(), config.WithKeepAlivesDisabled())...)
	if err != nil {
		return nil, fmt.Errorf("http_client_config: %w", err)
	}
	if fastEligible(c.endpoint, hc) {
		c.fast = newFastSender(c.endpoint, c.user, c.session)
	}
	return c, nil
}

// setEndpoint derives the endpoint from the base URL. Userinfo is kept out
// of the request URL (and so out of every transport error) and sent as
// basic auth, which is what net/http would do with it.
func (c *Client) setEndpoint(base string) error {
	u, err := url.Parse(base)
	if err != nil {
		// url.Parse errors quote the input, userinfo included.
		return errors.New("url: cannot be parsed")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("url: want http:// or https:// with a host")
	}
	c.user, u.User = u.User, nil
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	if c.api == APICompletions {
		u.Path += "/v1/completions"
	} else {
		u.Path += "/v1/chat/completions"
	}
	c.endpoint = *u
	return nil
}

func inlineSecrets(hc *config.HTTPClientConfig, user *url.Userinfo) []string {
	var s []string
	add := func(v string) {
		if v != "" {
			s = append(s, v)
		}
	}
	if user != nil {
		p, _ := user.Password()
		add(p)
	}
	if hc.BasicAuth != nil {
		add(string(hc.BasicAuth.Password))
	}
	if hc.Authorization != nil {
		add(string(hc.Authorization.Credentials))
	}
	add(string(hc.BearerToken))
	if hc.OAuth2 != nil {
		add(string(hc.OAuth2.ClientSecret))
	}
	return s
}

func secretFiles(hc *config.HTTPClientConfig) []string {
	var s []string
	add := func(path string) {
		if path != "" {
			s = append(s, path)
		}
	}
	if hc.BasicAuth != nil {
		add(hc.BasicAuth.PasswordFile)
	}
	if hc.Authorization != nil {
		add(hc.Authorization.CredentialsFile)
	}
	add(hc.BearerTokenFile)
	if hc.OAuth2 != nil {
		add(hc.OAuth2.ClientSecretFile)
	}
	return s
}

// Close releases the client's idle connections. Call it when the target is
// removed; requests still running are not affected.
func (c *Client) Close() {
	for _, rt := range []http.RoundTripper{c.http, c.fresh} {
		if ci, ok := rt.(interface{ CloseIdleConnections() }); ok {
			ci.CloseIdleConnections()
		}
	}
	if c.fast != nil {
		c.fast.close()
	}
}

// Do sends one request and measures its stream into res. It returns when
// the stream has ended, the request timed out or ctx was canceled; it
// always sets res.Outcome and never keeps anything running afterwards.
//
// Outcomes:
//   - timeout: the per-request deadline (RequestTimeout) expired, at any
//     point.
//   - canceled: ctx ended (cancel or the caller's own deadline).
//   - abandoned: the client closed the stream on purpose (Request.Abandon)
//     before it ended.
//   - connection_error: no response was received (dial, TLS, reset).
//     A request that failed on a reused kept-alive connection before any byte
//     of a response is first retried once on a new connection, with Sent
//     taken anew; the Response is that of the retry.
//   - http_error: a non-2xx status, with the message of the error body.
//     Redirects are not followed: a 3xx is an http_error too.
//     A row that cannot be encoded into a body is also an http_error,
//     with status 0: a server would have refused it with a 400.
//   - stream_error: an error event or error chunk (whether or not [DONE]
//     follows), a malformed chunk, finish_reason "abort" or "error", a
//     read error after the headers, or a stream that was cut off.
//   - success: [DONE] arrived (the body is then read for at most
//     doneGrace more, and closed if the server keeps it open), or the
//     body ended cleanly (EOF) after a chunk with a finish_reason or a
//     usage object. A clean end without either is a cut-off stream:
//     nothing says the generation completed.
func (c *Client) Do(ctx context.Context, req Request, res *Response) {
	*res = Response{}
	tctx, span := c.currentTracer().Start(ctx, c.spanName)
	res.Trace = span.Context()
	defer c.endSpan(span, &req, res)

	body, err := c.encodeRequest(req)
	if err != nil {
		res.Sent = time.Now()
		c.setOutcome(res, OutcomeHTTPError, "encode request: "+err.Error())
		return
	}
	rctx := tctx // ends with ctx; carries the trace context to inject
	if c.timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeoutCause(tctx, c.timeout, errRequestTimeout)
		defer cancel()
	}
	if req.Abandon.After > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeoutCause(rctx, req.Abandon.After, errAbandoned)
		defer cancel()
	}
	res.Sent = time.Now()
	// The phases of the last attempt, worked out once the request is over
	// (see phaseClock).
	clock := new(phaseClock)
	defer func() { res.Phases = clock.phases() }()
	var resp answer
	var retry bool
	if c.fast != nil {
		resp, retry, err = c.fast.send(rctx, body, req.Session, clock)
	} else {
		resp, retry, err = c.send(rctx, c.http, body, req.Session, clock)
	}
	if err != nil && retry && rctx.Err() == nil {
		// The server closed a kept-alive connection as the request went
		// out on it (its idle timeout): it cannot have answered. Go's
		// transport retries that itself only for idempotent requests, and
		// a POST is not one. Once, on a new connection, timed from the
		// new send so that TTFT does not include the failed attempt.
		first := err
		res.Sent = time.Now()
		clock = new(phaseClock)
		resp, _, err = c.send(rctx, c.fresh, body, req.Session, clock)
		if err != nil {
			// Only the retry's error classifies the request; the first is context.
			err = fmt.Errorf("%w (retried once: a reused connection failed with %v)", err, first) //nolint:errorlint
		}
	}
	if err != nil {
		o := c.classify(ctx, rctx, OutcomeConnectionError)
		c.setOutcome(res, o, c.failureText(o, err.Error()))
		return
	}
	defer resp.body.Close()
	res.HTTPStatus = resp.status

	if resp.status < 200 || resp.status > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.body, maxErrorBody))
		msg := errorBodyMessage(b)
		if msg == "" {
			msg = http.StatusText(resp.status)
		}
		c.setOutcome(res, OutcomeHTTPError, fmt.Sprintf("HTTP %d: %s", resp.status, msg))
		return
	}

	c.readStream(ctx, rctx, resp.body, resp.contentType, c.limitsFor(req, body.size()), req.Abandon.AfterTokens, res)
}

const (
	// promptAllowance is what a server may add to a prompt: a chat
	// template, a default system prompt.
	promptAllowance = 8192
	// completionAllowance is the slack over max_tokens. Engines told
	// ignore_eos and max_tokens stop at exactly max_tokens.
	completionAllowance = 16
)

// lengthKeys are body members that change how many output tokens a request
// may yield, or what max_tokens means.
var lengthKeys = []string{"max_tokens", "max_completion_tokens", "n_predict", "n", "best_of"}

// limitsFor derives from a request and its encoded body the largest usage
// counts a server could truthfully report for it. Text of b bytes is at
// most b tokens for a byte-level or character-level tokenizer; twice the
// body's bytes plus promptAllowance leaves room for any other, and covers
// whatever in the body may become prompt tokens (tools, a chat_template in
// an extra). Rows with chat messages or a whole payload may carry images,
// whose tokens their bytes do not bound: they get only the absolute limit.
// Output is bounded by max_tokens unless the body may set its own (a
// payload, or an extra with one of lengthKeys).
func (c *Client) limitsFor(req Request, bodyLen int) usageLimits {
	l := anyRequest
	if req.Payload == nil && len(req.Messages) == 0 {
		l.prompt, l.bodyLen = min(2*bodyLen+promptAllowance, maxUsageTokens), bodyLen
	}
	if req.MaxTokens > 0 && req.Payload == nil && !c.extraSetsLength && !mentionsLengthKey(req.Extra) {
		l.completion, l.maxTokens = min(req.MaxTokens+completionAllowance, maxUsageTokens), req.MaxTokens
	}
	return l
}

// quotedLengthKeys are lengthKeys as JSON strings, for mentionsLengthKey.
var quotedLengthKeys = func() [][]byte {
	q := make([][]byte, len(lengthKeys))
	for i, k := range lengthKeys {
		q[i] = appendJSONString(nil, k)
	}
	return q
}()

// mentionsLengthKey reports whether the JSON object raw may hold one of
// lengthKeys. It errs towards yes (a key's name as a string value counts):
// that only loosens a limit.
func mentionsLengthKey(raw []byte) bool {
	if len(raw) == 0 {
		return false
	}
	for _, k := range quotedLengthKeys {
		if bytes.Contains(raw, k) {
			return true
		}
	}
	return false
}

// send makes one attempt at the request, its phases timed by clock. On
// failure, retry reports that the attempt went out on a reused
// (kept-alive) connection and failed before any byte of a response
// arrived, which is what a server closing an idle connection at that
// moment looks like. Any reused connection counts, not only one taken
// from the idle pool: one handed straight to a request that was dialing
// (WasIdle false) has been idle on the server's side since its last
// answer, on a busy machine long enough for the server to close it.
func (c *Client) send(rctx context.Context, rt http.RoundTripper, body requestBody, session string, clock *phaseClock) (ans answer, retry bool, err error) {
	tctx := httptrace.WithClientTrace(rctx, clock.trace())
	// The endpoint was parsed once (setEndpoint): each request gets a copy
	// of it rather than parsing it again.
	hreq, err := http.NewRequestWithContext(tctx, http.MethodPost, "", body.reader())
	if err != nil {
		return answer{}, false, fmt.Errorf("build request: %w", err)
	}
	u := c.endpoint
	hreq.URL, hreq.Host = &u, u.Host
	// A reader of pieces is not one whose length net/http finds itself.
	hreq.ContentLength = int64(body.size())
	hreq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.reader()), nil }
	hreq.Header["Content-Type"] = contentTypeJSON
	hreq.Header["Accept"] = acceptEventStream
	hreq.Header["User-Agent"] = userAgent
	tracing.Inject(rctx, hreq.Header)
	if c.session != "" && session != "" {
		hreq.Header.Set(c.session, sessionValue(session))
	}
	if c.user != nil {
		p, _ := c.user.Password()
		hreq.SetBasicAuth(c.user.Username(), p)
	}
	resp, err := rt.RoundTrip(hreq)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // drop the URL: the target name already says which endpoint
		}
		return answer{}, clock.failedOnReused(), err
	}
	if resp == nil {
		return answer{}, false, errors.New("the transport returned neither a response nor an error")
	}
	return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: resp.Body}, false, nil
}

// answer is what an attempt got back. Its body must be closed.
type answer struct {
	status      int
	contentType string
	body        io.ReadCloser
}

// readStream consumes a 2xx streaming body into res and decides the
// outcome (see Do). With abandonAfter above 0 it stops reading once that
// many content chunks arrived; Do then closes the body.
func (c *Client) readStream(ctx, rctx context.Context, body io.Reader, contentType string, lim usageLimits, abandonAfter int, res *Response) {
	sp, _ := c.streams.Get().(*streamParser)
	if sp == nil {
		sp = new(streamParser)
	}
	defer c.putStream(sp)
	sp.sse.reset(body, nil)
	sp.state.reset()
	st := &sp.state
	st.lim = lim
	abandoned := false
	for {
		ev, ok := sp.sse.next()
		if !ok || st.handle(ev) {
			break
		}
		if abandonAfter > 0 && st.contentChunks >= abandonAfter && !st.done && !st.failed {
			abandoned = true
			break
		}
	}
	if abandoned {
		c.fillUsage(res, st)
		c.setOutcome(res, OutcomeAbandoned, fmt.Sprintf("closed after %d tokens (abandon.after_tokens)", st.contentChunks))
		return
	}
	if !st.failed {
		st.checkUsage()
	}
	if st.done && !st.failed {
		drainAfterDone(&sp.sse, body, &sp.grace)
	}
	c.fillUsage(res, st)

	readErr := sp.sse.err
	switch {
	case st.failed:
		c.setOutcome(res, OutcomeStreamError, st.failMsg)
	case st.abort != "" && (st.done || errors.Is(readErr, io.EOF)):
		c.setOutcome(res, OutcomeStreamError, "finish_reason "+st.abort)
	case st.done:
		res.Outcome = OutcomeSuccess
	case !errors.Is(readErr, io.EOF):
		o := c.classify(ctx, rctx, OutcomeStreamError)
		c.setOutcome(res, o, c.failureText(o, "read body: "+readErr.Error()))
	case st.finished || st.usageSeen:
		res.Outcome = OutcomeSuccess
	case st.events == 0 && !isEventStream(contentType):
		c.setOutcome(res, OutcomeStreamError, fmt.Sprintf("no events; content type %q is not text/event-stream", contentType))
	default:
		c.setOutcome(res, OutcomeStreamError, "stream ended without [DONE], finish_reason or usage")
	}
}

// drainAfterDone reads on after [DONE], which lets the transport reuse the
// connection: servers end the body right after it, though the last chunk
// may come in a packet of its own. A server that keeps the body open would
// hold the request, and its slot, until request_timeout; so after
// doneGrace the body is closed, which unblocks the read and drops the
// connection. The measurements are complete at [DONE] either way.
func drainAfterDone(r *sseReader, body io.Reader, g *graceCloser) {
	closer, ok := body.(io.Closer)
	if !ok {
		r.drain(maxDrain)
		return
	}
	g.body = closer
	if g.t == nil {
		g.closed = make(chan struct{}, 1)
		g.t = time.AfterFunc(doneGrace, g.fire)
	} else {
		g.t.Reset(doneGrace)
	}
	r.drain(maxDrain)
	if !g.t.Stop() {
		<-g.closed // Do returns nothing still running
	}
	g.body = nil
}

// putStream returns a parser to the pool without the body it read, and
// drops buffers that one huge event grew, so the pool does not pin them.
func (c *Client) putStream(sp *streamParser) {
	sp.sse.r = nil
	if cap(sp.sse.buf) > sseInitialBuffer {
		sp.sse.buf = nil
	}
	if cap(sp.sse.data) > sseInitialBuffer {
		sp.sse.data = nil
	}
	c.streams.Put(sp)
}

// failureText replaces the transport's wording for deadlines and
// cancellations, which says nothing useful ("context canceled").
func (c *Client) failureText(o Outcome, text string) string {
	switch o {
	case OutcomeTimeout:
		return fmt.Sprintf("request_timeout %v expired", c.timeout)
	case OutcomeCanceled:
		return "canceled by the caller"
	case OutcomeAbandoned:
		return "closed on purpose (abandon.after)"
	}
	return text
}

// classify tells a deadline or cancellation from other failures: the
// transport reports those as ordinary errors.
func (c *Client) classify(ctx, rctx context.Context, otherwise Outcome) Outcome {
	switch {
	case errors.Is(context.Cause(rctx), errRequestTimeout):
		return OutcomeTimeout
	case errors.Is(context.Cause(rctx), errAbandoned):
		return OutcomeAbandoned
	case ctx.Err() != nil:
		return OutcomeCanceled
	}
	return otherwise
}

// fillUsage copies token counts from the stream into res.
func (c *Client) fillUsage(res *Response, st *streamState) {
	res.FirstToken, res.LastToken = st.first, st.last
	res.PrefillTime, res.PrefillKnown = st.prefill, st.prefillKnown
	if st.usageBad {
		res.OutputTokens = st.contentChunks
		return
	}
	if st.completionKnown {
		res.OutputTokens, res.OutputFromUsage = st.completion, true
	} else {
		res.OutputTokens = st.contentChunks
	}
	res.PromptTokens, res.PromptKnown = st.prompt, st.promptKnown
	switch {
	case st.cachedKnown:
		res.CachedTokens, res.CachedKnown = st.cached, true
		c.cachedReported.Store(true)
	case st.cacheNKnown:
		res.CachedTokens, res.CachedKnown = st.cacheN, true
	case st.usageSeen && c.spec.AbsentCachedIsZero && c.cachedReported.Load():
		// SGLang (and Dynamo passing its usage through) drop
		// prompt_tokens_details when the count is 0, and also when cache
		// reporting is off. Once this target has reported a count, the
		// reporting is on, so an absence is a zero; before that it stays
		// unknown rather than turning "not reported" into a 0% hit rate.
		res.CachedTokens, res.CachedKnown = 0, true
	}
}

func (c *Client) setOutcome(res *Response, o Outcome, msg string) {
	res.Outcome = o
	res.Error = c.scrub(msg)
	if res.Error == "" {
		// A server's error message can be blank ({"error": {"message": " "}}):
		// a failure still needs a reason in the log.
		res.Error = string(o) + " without a message from the server"
	}
}

// scrub makes an error text safe and short for logs: no URL userinfo, no
// configured inline credential, no Authorization-style token, one line.
func (c *Client) scrub(s string) string {
	s = stripUserinfo(s)
	for _, secret := range c.secrets {
		s = strings.ReplaceAll(s, secret, "<secret>")
	}
	// Read now rather than at NewClient: the file may have been rotated
	// since. This runs once per failed request, which has already cost a
	// round trip, so the read is cheap in comparison.
	for _, path := range c.secretFiles {
		b, err := os.ReadFile(path)
		if secret := strings.TrimSpace(string(b)); err == nil && secret != "" {
			s = strings.ReplaceAll(s, secret, "<secret>")
		}
	}
	s = redactAuthTokens(s)
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxErrorText {
		cut := maxErrorText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// stripUserinfo removes "user:pass@" from every scheme://authority in s.
func stripUserinfo(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			break
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		end := strings.IndexAny(s, "/?# \t\n\"'")
		if end < 0 {
			end = len(s)
		}
		if at := strings.LastIndexByte(s[:end], '@'); at >= 0 {
			s = s[at+1:]
		}
	}
	if b.Len() == 0 {
		return s
	}
	b.WriteString(s)
	return b.String()
}

// redactAuthTokens replaces the token after "Bearer " or "Basic " (any
// case), in case a server echoes request headers into its error.
func redactAuthTokens(s string) string {
	lower := strings.ToLower(s)
	if !strings.Contains(lower, "bearer ") && !strings.Contains(lower, "basic ") {
		return s
	}
	fields := strings.Fields(s)
	for i := 0; i+1 < len(fields); i++ {
		switch strings.ToLower(strings.Trim(fields[i], `"':`)) {
		case "bearer", "basic":
			fields[i+1] = "<secret>"
		}
	}
	return strings.Join(fields, " ")
}

// errorBodyMessage extracts the message of a non-2xx body: one of the three
// JSON error shapes, else the text itself. It does not shorten the text:
// scrub does, after replacing secrets, so that none is cut in two and
// half of it kept.
func errorBodyMessage(b []byte) string {
	var p fastjson.Parser
	if v, err := p.ParseBytes(b); err == nil && v.Type() == fastjson.TypeObject {
		if t := errorText(v); t != "" {
			return t
		}
	}
	return strings.ToValidUTF8(string(bytes.TrimSpace(b)), "")
}

func isEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}
