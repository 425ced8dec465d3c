package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/valyala/fastjson"
)

// Chunks are decoded with github.com/valyala/fastjson. A reused
// fastjson.Parser parses a typical 200–400 byte chunk without allocating
// and validates the whole document, so a malformed chunk is detected rather
// than half-read (jsonparser, the other zero-allocation candidate, looks up
// paths without validating). encoding/json allocates per chunk and is
// several times slower; a hand-written scanner would have to re-create that
// validation.

const (
	sseInitialBuffer = 16 << 10
	// sseMaxEvent bounds one line and one event's joined data, so a server
	// that never sends a newline cannot make the client buffer without end.
	sseMaxEvent = 16 << 20
)

const utf8BOM = "\xef\xbb\xbf"

var errEventTooLarge = errors.New("SSE event exceeds 16 MiB")

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	data       []byte // data lines joined with \n; valid until the next call to next
	errorEvent bool   // the event had "event: error"
	comment    []byte // the last non-empty comment line inside the event
	at         time.Time
}

// sseReader splits a text/event-stream body into events. It follows the
// WHATWG framing with the leniencies real servers need: "data:" with or
// without the space, CRLF line ends, comment lines (":" pings), and an
// event still pending when the body ends is delivered as if a blank line
// had followed. A lone CR as a line end (allowed by the spec, used by none
// of the engines we target) is not recognised.
type sseReader struct {
	r    io.Reader
	now  func() time.Time // nil: the monotonic clock from base (monoNow)
	base time.Time

	buf        []byte // buf[start:end] is read but not yet consumed
	start, end int
	scan       int       // buf[start:scan] holds no newline
	arrived    time.Time // when the last Read returning bytes came back
	err        error     // why the body ended: io.EOF or a read error
	bomDone    bool

	data       []byte
	hasData    bool
	errorEvent bool
	comment    []byte
}

func (r *sseReader) reset(body io.Reader, now func() time.Time) {
	if r.buf == nil {
		r.buf = make([]byte, sseInitialBuffer)
	}
	*r = sseReader{r: body, now: now, buf: r.buf, data: r.data[:0], comment: r.comment[:0]}
	if now == nil {
		r.base = time.Now()
	}
}

// monoNow is the time now read from the monotonic clock alone, as an
// offset from the stream's start: half the cost of time.Now, which reads
// the wall clock too, for a reading taken at every read of the body.
func (r *sseReader) monoNow() time.Time {
	if r.now != nil {
		return r.now()
	}
	return r.base.Add(time.Since(r.base))
}

// next returns the next event; ok is false when the body has ended, and
// r.err then tells how.
func (r *sseReader) next() (ev sseEvent, ok bool) {
	for {
		line, ok := r.readLine()
		if !ok {
			// A clean end delivers a pending event; after a read error it
			// may be partial, so it is dropped.
			if errors.Is(r.err, io.EOF) && (r.hasData || r.errorEvent) {
				return r.dispatch(), true
			}
			return sseEvent{}, false
		}
		if len(line) == 0 {
			if r.hasData || r.errorEvent {
				return r.dispatch(), true
			}
			r.comment = r.comment[:0]
			continue
		}
		if !r.field(line) {
			return sseEvent{}, false
		}
	}
}

func (r *sseReader) dispatch() sseEvent {
	ev := sseEvent{at: r.arrived, errorEvent: r.errorEvent, comment: r.comment}
	if r.hasData {
		ev.data = r.data
	}
	r.hasData, r.errorEvent = false, false
	r.comment = r.comment[:0]
	return ev
}

// field interprets one non-empty line; false means the event grew too large.
func (r *sseReader) field(line []byte) bool {
	if line[0] == ':' {
		c := line[1:]
		if len(c) > 0 && c[0] == ' ' {
			c = c[1:]
		}
		if len(c) > 0 {
			r.comment = append(r.comment[:0], c...)
		}
		return true
	}
	name, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		if r.hasData {
			r.data = append(r.data, '\n')
		} else {
			r.data = r.data[:0]
		}
		if len(r.data)+len(value) > sseMaxEvent {
			r.err = errEventTooLarge
			return false
		}
		r.data = append(r.data, value...)
		r.hasData = true
	case "event":
		r.errorEvent = string(bytes.TrimSpace(value)) == "error"
	}
	// id, retry and unknown fields carry nothing the client uses.
	return true
}

// readLine returns the next line without its line end; ok is false once the
// body is exhausted.
func (r *sseReader) readLine() (line []byte, ok bool) {
	for {
		// Search only bytes not searched before, so a line arriving in
		// many small reads costs linear time.
		if i := bytes.IndexByte(r.buf[r.scan:r.end], '\n'); i >= 0 {
			line = r.buf[r.start : r.scan+i]
			r.start = r.scan + i + 1
			r.scan = r.start
			return r.trimLine(line), true
		}
		r.scan = r.end
		if r.err != nil {
			if errors.Is(r.err, io.EOF) && r.start < r.end {
				line = r.buf[r.start:r.end]
				r.start = r.end
				return r.trimLine(line), true
			}
			return nil, false
		}
		r.fill()
	}
}

func (r *sseReader) trimLine(line []byte) []byte {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if !r.bomDone {
		r.bomDone = true
		if len(line) >= len(utf8BOM) && string(line[:len(utf8BOM)]) == utf8BOM {
			line = line[len(utf8BOM):]
		}
	}
	return line
}

// fill reads more of the body. When the buffer is full it first makes room:
// it moves the unconsumed bytes to the front if that frees at least half,
// else doubles the buffer, so each byte is moved O(1) times on average.
func (r *sseReader) fill() {
	if r.end == len(r.buf) {
		pending := r.end - r.start
		dst := r.buf
		if pending > len(r.buf)/2 {
			if len(r.buf) >= sseMaxEvent {
				r.err = errEventTooLarge
				return
			}
			dst = make([]byte, min(2*len(r.buf), sseMaxEvent))
		}
		copy(dst, r.buf[r.start:r.end])
		r.buf = dst
		r.scan -= r.start
		r.start, r.end = 0, pending
	}
	// A Reader may return 0, nil; give up after many in a row, as bufio does.
	for range 100 {
		n, err := r.r.Read(r.buf[r.end:])
		if n > 0 {
			r.end += n
			r.arrived = r.monoNow()
		}
		if err != nil {
			r.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.err = io.ErrNoProgress
}

// drain reads and discards up to limit more bytes of the body, reusing the
// read buffer (io.CopyN would allocate on every request).
func (r *sseReader) drain(limit int) {
	for n := 0; n < limit && r.err == nil; {
		k, err := r.r.Read(r.buf)
		n += k
		if err != nil {
			r.err = err
		} else if k == 0 {
			return
		}
	}
}

// streamState interprets the events of one streamed completion.
type streamState struct {
	p    fastjson.Parser
	tmpl chunkTemplate // see chunkfast.go

	events        int
	contentChunks int
	first, last   time.Time

	done     bool   // [DONE] received
	finished bool   // some choice carried a finish_reason
	abort    string // finish_reason "abort" or "error"
	failed   bool
	failMsg  string

	lim             usageLimits
	usageSeen       bool
	usageBad        bool // a count no request could produce: none of the usage is kept
	prompt          int
	promptKnown     bool
	completion      int
	completionKnown bool
	cached          int
	cachedKnown     bool
	cacheN          int // llama.cpp timings.cache_n
	cacheNKnown     bool
	prefill         time.Duration // the engine's prefill time (see Response.PrefillTime)
	prefillKnown    bool
}

func (s *streamState) reset() {
	s.tmpl.clear()
	*s = streamState{p: s.p, tmpl: s.tmpl, lim: anyRequest}
}

func (s *streamState) fail(msg string) bool {
	s.failed, s.failMsg = true, msg
	return true
}

// handle interprets one event and reports whether the stream is over
// ([DONE], an error, or a chunk that cannot be read).
func (s *streamState) handle(ev sseEvent) (stop bool) {
	s.events++
	if ev.errorEvent {
		// Old Dynamo frames: "event: error" with the reason in a comment
		// line, or in the data.
		msg := bytes.TrimSpace(ev.data)
		if v, err := s.p.ParseBytes(msg); err == nil && v.Type() == fastjson.TypeObject {
			if t := errorText(v); t != "" {
				return s.fail("error event: " + t)
			}
		}
		if len(msg) == 0 {
			msg = ev.comment
		}
		if len(msg) == 0 {
			return s.fail("error event")
		}
		return s.fail("error event: " + string(msg))
	}
	data := bytes.TrimSpace(ev.data)
	if len(data) == 0 {
		return false
	}
	if string(data) == "[DONE]" {
		s.done = true
		return true
	}
	if empty, ok := s.tmpl.match(data); ok {
		if !empty {
			s.content(ev.at)
		}
		return false
	}
	v, err := s.p.ParseBytes(data)
	if err != nil {
		return s.fail("malformed chunk: " + err.Error())
	}
	obj, err := v.Object()
	if err != nil {
		return s.fail("chunk is not a JSON object")
	}
	// Mid-stream errors: {"error": {...}} (vLLM, Dynamo, llama.cpp, TGI's
	// OpenAI route), {"error": "..."} (TGI), {"object": "error", ...} (flat).
	if e := obj.Get("error"); e != nil && e.Type() != fastjson.TypeNull {
		return s.fail(orDefault(errorText(v), "error chunk"))
	}
	if o := obj.Get("object"); o != nil && string(o.GetStringBytes()) == "error" {
		return s.fail(orDefault(errorText(v), "error chunk"))
	}

	content := false
	if ch := obj.Get("choices"); ch != nil && ch.Type() == fastjson.TypeArray {
		choices, _ := ch.Array()
		for _, c := range choices {
			if c.Type() != fastjson.TypeObject {
				continue
			}
			if choiceHasContent(c) {
				content = true
			}
			if fr := c.Get("finish_reason"); fr != nil && fr.Type() == fastjson.TypeString {
				switch r := fr.GetStringBytes(); string(r) {
				case "":
				case "abort", "error":
					s.finished = true
					s.abort = string(r)
				default:
					s.finished = true
				}
			}
		}
	}
	if content {
		s.content(ev.at)
	}
	s.tmpl.learn(data, obj)
	return !s.accounts(obj)
}

// accounts reads what a chunk reports of the request as a whole: its
// usage, llama.cpp's timings, vLLM's per-request metrics. It returns
// false, having failed the stream, where a count is impossible.
func (s *streamState) accounts(obj *fastjson.Object) bool {
	if u := obj.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
		// Fields present in a later usage object (continuous usage stats)
		// replace earlier ones; absent ones keep what was seen.
		s.usageSeen = true
		if !s.count(u.Get("prompt_tokens"), fieldPrompt, &s.prompt, &s.promptKnown) ||
			!s.count(u.Get("completion_tokens"), fieldCompletion, &s.completion, &s.completionKnown) ||
			!s.count(u.Get("prompt_tokens_details", "cached_tokens"), fieldCached, &s.cached, &s.cachedKnown) {
			return false
		}
	}
	timings := obj.Get("timings")
	if !s.count(timings.Get("cache_n"), fieldCacheN, &s.cacheN, &s.cacheNKnown) {
		return false
	}
	s.duration(timings.Get("prompt_ms"), &s.prefill, &s.prefillKnown)
	s.duration(obj.Get("metrics").Get("time_to_first_token_ms"), &s.prefill, &s.prefillKnown)
	return true
}

// maxPrefill bounds a prefill time taken from a response: beyond it the
// figure is a broken server's.
const maxPrefill = time.Hour

// duration reads a time in milliseconds into d. Unlike a token count, a
// time that no request could take (negative, not finite, beyond
// maxPrefill) or that is no number leaves d as it was: it says nothing of
// the server's accounting of tokens, so the request still counts.
func (s *streamState) duration(v *fastjson.Value, d *time.Duration, known *bool) {
	if v == nil || v.Type() != fastjson.TypeNumber {
		return
	}
	ms, err := v.Float64()
	if err != nil || !(ms >= 0 && ms <= float64(maxPrefill/time.Millisecond)) {
		return
	}
	*d, *known = time.Duration(ms*float64(time.Millisecond)), true
}

// content counts a chunk that carried content, arrived at.
func (s *streamState) content(at time.Time) {
	if s.first.IsZero() {
		s.first = at
	}
	s.last = at
	s.contentChunks++
}

// usageField names a token count a response reports.
type usageField string

const (
	fieldPrompt     usageField = "usage.prompt_tokens"
	fieldCompletion usageField = "usage.completion_tokens"
	fieldCached     usageField = "usage.prompt_tokens_details.cached_tokens"
	fieldCacheN     usageField = "timings.cache_n" // llama.cpp
)

// maxUsageTokens bounds every count: 16 Mi tokens is above any context
// window in use (the largest are about 10 M), so a larger count is a
// broken server's, not a long request's.
const maxUsageTokens = 1 << 24

// usageLimits bounds the counts a response may report for one request
// (see Client.limitsFor).
type usageLimits struct {
	prompt     int // prompt tokens, and cached tokens, at most
	bodyLen    int // the request body's bytes prompt was derived from; 0 for any request
	completion int // output tokens at most
	maxTokens  int // the max_tokens completion was derived from; 0 for any request
}

// anyRequest holds only what no request can exceed.
var anyRequest = usageLimits{prompt: maxUsageTokens, completion: maxUsageTokens}

func (l *usageLimits) of(f usageField) int {
	if f == fieldCompletion {
		return l.completion
	}
	return l.prompt
}

// count reads a token count into n. Absent, null or non-numeric values
// leave it as it was: a server need not report it. A number that no
// request could produce fails the stream and returns false: the server's
// accounting cannot be trusted, so none of its usage is used.
func (s *streamState) count(v *fastjson.Value, f usageField, n *int, known *bool) bool {
	if v == nil || v.Type() != fastjson.TypeNumber {
		return true
	}
	// A float64 is exact up to 2^53, far above any limit, and above it
	// still compares right; fastjson's Int would reject 1e3 and 4.0.
	x, err := v.Float64()
	limit := s.lim.of(f)
	switch {
	case err != nil:
		// Not expected: fastjson has validated the number (1e999 is +Inf).
		s.usageFail(f, v, "is not a usable number")
	case x < 0:
		s.usageFail(f, v, "is negative")
	case x != math.Trunc(x):
		s.usageFail(f, v, "is not a whole number")
	case x > float64(limit) && f == fieldCompletion && s.lim.maxTokens > 0:
		s.usageFail(f, v, fmt.Sprintf("exceeds max_tokens %d (%d at most)", s.lim.maxTokens, limit))
	case x > float64(limit) && s.lim.bodyLen > 0 && f != fieldCompletion:
		s.usageFail(f, v, fmt.Sprintf("is more than the request could hold (%d at most, from its %d-byte body)", limit, s.lim.bodyLen))
	case x > float64(limit):
		s.usageFail(f, v, fmt.Sprintf("is more than any request could hold (%d at most)", limit))
	default:
		*n, *known = int(x), true
		return true
	}
	return false
}

func (s *streamState) usageFail(f usageField, v *fastjson.Value, why string) {
	s.usageBad = true
	s.fail(fmt.Sprintf("%s %s %s", f, v, why))
}

// checkUsage compares the final counts with each other: cached tokens are
// part of the prompt.
func (s *streamState) checkUsage() {
	if !s.promptKnown {
		return
	}
	for _, c := range []struct {
		f     usageField
		n     int
		known bool
	}{{fieldCached, s.cached, s.cachedKnown}, {fieldCacheN, s.cacheN, s.cacheNKnown}} {
		if c.known && c.n > s.prompt {
			s.usageBad = true
			s.fail(fmt.Sprintf("%s %d exceeds %s %d", c.f, c.n, fieldPrompt, s.prompt))
			return
		}
	}
}

// choiceHasContent: a delta with non-empty content, reasoning,
// reasoning_content or tool-call name/arguments text, or a completions
// choice with non-empty text. A role-only or empty delta is not content.
func choiceHasContent(c *fastjson.Value) bool {
	if nonEmptyString(c.Get("text")) {
		return true
	}
	d := c.Get("delta")
	if d == nil || d.Type() != fastjson.TypeObject {
		return false
	}
	if nonEmptyString(d.Get("content")) || nonEmptyString(d.Get("reasoning_content")) || nonEmptyString(d.Get("reasoning")) {
		return true
	}
	if tc := d.Get("tool_calls"); tc != nil && tc.Type() == fastjson.TypeArray {
		calls, _ := tc.Array()
		for _, call := range calls {
			f := call.Get("function")
			if nonEmptyString(f.Get("name")) || nonEmptyString(f.Get("arguments")) {
				return true
			}
		}
	}
	return false
}

// nonEmptyString is nil-safe, as fastjson's Get is on a nil *Value.
func nonEmptyString(v *fastjson.Value) bool {
	return v != nil && v.Type() == fastjson.TypeString && len(v.GetStringBytes()) > 0
}

// errorText extracts the message of an error document in any of the three
// shapes servers use: nested OpenAI {"error":{"message","type",...}}, flat
// {"object":"error","message",...}, and TGI {"error":"...","error_type":...}.
func errorText(v *fastjson.Value) string {
	var msg, typ []byte
	switch e := v.Get("error"); {
	case e == nil:
	case e.Type() == fastjson.TypeString:
		msg, typ = e.GetStringBytes(), v.GetStringBytes("error_type")
	case e.Type() == fastjson.TypeObject:
		msg, typ = e.GetStringBytes("message"), e.GetStringBytes("type")
	}
	if len(msg) == 0 {
		msg, typ = v.GetStringBytes("message"), v.GetStringBytes("type")
	}
	switch {
	case len(msg) == 0 && len(typ) == 0:
		return ""
	case len(typ) == 0:
		return string(msg)
	case len(msg) == 0:
		return string(typ)
	}
	return string(typ) + ": " + string(msg)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
