package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// PromptFormat is how a built prompt is sent: as text, or as the token ids
// of the target's tokenizer.
type PromptFormat string

// Prompt formats of target.prompt_format.
const (
	PromptFormatText     PromptFormat = "text"
	PromptFormatTokenIDs PromptFormat = "token_ids"
)

// PromptFormats lists every prompt format.
var PromptFormats = [...]PromptFormat{PromptFormatText, PromptFormatTokenIDs}

const (
	jsonTrue     = "true"
	includeUsage = `{"include_usage":true}`
)

// bodyField is one top-level member of a request body: its key and its
// value as JSON text.
type bodyField struct {
	key string
	val []byte

	// With escaped set, the value is before, then text as a JSON string,
	// then after, written only when the body is assembled: a prompt is
	// copied into the body once instead of into a value first, and not
	// at all when shared is set (see requestBody).
	escaped       bool
	shared        bool
	text          string
	before, after string
}

// requestBody is a request's JSON in pieces. In a body over maxFlatBody, a
// long text that needs no escaping (a built prompt never does) is a piece
// of its own that shares the text's memory, so that the prompt is not
// copied into the body. A smaller body is one piece.
type requestBody [][]byte

func (r requestBody) size() int {
	n := 0
	for _, p := range r {
		n += len(p)
	}
	return n
}

// reader reads the body from its start; each call gets its own. A body of
// one piece is read from a bytes.Reader, a type net/http knows to be in
// memory: it then writes the headers and the body in one write, where for
// any other reader it flushes the headers first, which costs a system call
// and a packet more on each side.
func (r requestBody) reader() io.Reader {
	if len(r) == 1 {
		return bytes.NewReader(r[0])
	}
	bufs := net.Buffers(slices.Clone(r))
	return &bufs
}

const (
	// minShared is the shortest text worth a piece of its own.
	minShared = 1024
	// maxFlatBody is the largest body kept in one piece even when a text
	// could be shared: the size of the transport's write buffer, which
	// then holds the headers and the body for one write. A larger body
	// takes two writes either way, so copying it would save nothing.
	maxFlatBody = 4 << 10
)

// shareable reports whether s can go into the body as it is, between
// quotes: it is long, valid UTF-8, and has nothing appendJSONString would
// escape.
func shareable(s string) bool {
	if len(s) < minShared {
		return false
	}
	ascii := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	return ascii || utf8.ValidString(s)
}

// bodyBuilder assembles a JSON object whose members keep the order in which
// they were first set, so bodies are deterministic and a verbatim payload
// keeps its own order. Setting an existing key replaces its value in place.
type bodyBuilder struct {
	fields []bodyField
}

// builders keeps bodyBuilders between requests: their fields, about a
// kilobyte, are needed only until the body is assembled.
var builders = sync.Pool{New: func() any { return &bodyBuilder{fields: make([]bodyField, 0, 16)} }}

func newBodyBuilder() *bodyBuilder { return builders.Get().(*bodyBuilder) }

// release returns b to the pool, keeping none of the request's values; a
// builder a payload of many members grew is left to the collector.
func (b *bodyBuilder) release() {
	if cap(b.fields) > 64 {
		return
	}
	clear(b.fields)
	b.fields = b.fields[:0]
	builders.Put(b)
}

func (b *bodyBuilder) set(key string, val []byte) {
	b.put(bodyField{key: key, val: val})
}

// setText sets key to before + text as a JSON string + after.
func (b *bodyBuilder) setText(key, before, text, after string) {
	b.put(bodyField{key: key, escaped: true, shared: shareable(text), before: before, text: text, after: after})
}

func (b *bodyBuilder) put(f bodyField) {
	for i := range b.fields {
		if b.fields[i].key == f.key {
			b.fields[i] = f
			return
		}
	}
	b.fields = append(b.fields, f)
}

// merge sets every member of the JSON object raw (a shallow merge: raw's
// values win). A JSON null or empty input merges nothing.
func (b *bodyBuilder) merge(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil {
		return err
	} else if tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string) // object keys are always strings
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return fmt.Errorf("member %q: %w", key, err)
		}
		b.set(key, val)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// pieces assembles the body.
func (b *bodyBuilder) pieces() requestBody {
	n := 2 // the bytes copied into buf
	sharedText := 0
	for _, f := range b.fields {
		n += len(f.key) + len(f.val) + 4
		if f.escaped {
			n += len(f.before) + len(f.after) + 2
			if f.shared {
				sharedText += len(f.text)
			} else {
				// Room for a few escapes, so that the usual text fits.
				n += len(f.text) + len(f.text)/32
			}
		}
	}
	flat := n+sharedText <= maxFlatBody
	if flat {
		n += sharedText
	}
	var out requestBody
	buf := make([]byte, 0, n)
	start := 0 // of the piece buf is making
	buf = append(buf, '{')
	for i, f := range b.fields {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendJSONString(buf, f.key)
		buf = append(buf, ':')
		if !f.escaped {
			buf = append(buf, f.val...)
			continue
		}
		buf = append(buf, f.before...)
		switch {
		case f.shared && flat:
			// No escapes to look for: a copy as it is.
			buf = append(buf, '"')
			buf = append(buf, f.text...)
			buf = append(buf, '"')
		case f.shared:
			buf = append(buf, '"')
			out = append(out, buf[start:len(buf):len(buf)])
			// Read only, by the transport, while the request lives.
			out = append(out, unsafe.Slice(unsafe.StringData(f.text), len(f.text)))
			start = len(buf)
			buf = append(buf, '"')
		default:
			buf = appendJSONString(buf, f.text)
		}
		buf = append(buf, f.after...)
	}
	buf = append(buf, '}')
	return append(out, buf[start:])
}

// appendJSONString appends s as a JSON string. Unlike encoding/json it does
// not escape <, > and &: prompts are large and those escapes only cost
// bytes. Invalid UTF-8 becomes U+FFFD, as with encoding/json, because
// Python servers reject a body that does not decode.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
				start = i + 1
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// encodeExtraBody turns the target's extra_body into body fields, sorted by
// key so that bodies do not depend on map order.
func encodeExtraBody(extra map[string]any) ([]bodyField, error) {
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fields := make([]bodyField, 0, len(keys))
	var errs []error
	for _, k := range keys {
		v, err := normalizeYAML(extra[k])
		if err == nil && k == "stream" && v != true {
			err = errors.New("the client always streams")
		}
		var b []byte
		if err == nil {
			b, err = json.Marshal(v)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("extra_body.%s: %w", k, err))
			continue
		}
		fields = append(fields, bodyField{key: k, val: b})
	}
	return fields, errors.Join(errs...)
}

// normalizeYAML converts the map[any]any a YAML v2 decoder produces for
// nested mappings into map[string]any, which encoding/json can marshal.
func normalizeYAML(v any) (any, error) {
	switch t := v.(type) {
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("non-string key %v", k)
			}
			n, err := normalizeYAML(e)
			if err != nil {
				return nil, err
			}
			m[ks] = n
		}
		return m, nil
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			n, err := normalizeYAML(e)
			if err != nil {
				return nil, err
			}
			m[k] = n
		}
		return m, nil
	case []any:
		s := make([]any, len(t))
		for i, e := range t {
			n, err := normalizeYAML(e)
			if err != nil {
				return nil, err
			}
			s[i] = n
		}
		return s, nil
	}
	return v, nil
}

// encodeRequest builds the JSON body for one trace row.
//
// Rows with a Payload send it verbatim except for three members the
// measurement depends on: model is set to the target's model when one is
// configured (a trace is replayed against targets serving different model
// names), stream is forced true and stream_options asks for usage.
// Output-length fields are not added to a payload; it carries its own.
//
// Other rows get: model, messages (chat: one user message with Prompt, or
// Messages verbatim plus Tools) or prompt (completions: Prompt or
// PromptTokenIDs), stream, stream_options, and with MaxTokens > 0 the
// dialect's output-length fields.
//
// Then the target's extra_body is merged, then the row's Extra (shallow,
// later wins), and finally stream is set true again: the client can only
// measure a streamed response. A cache salt is set last too, over any a
// payload, extra_body or Extra carried: the isolation it promises must
// hold for every request.
func (c *Client) encodeRequest(req Request) (requestBody, error) {
	b := newBodyBuilder()
	defer b.release()
	if req.Payload != nil {
		if err := b.merge(req.Payload); err != nil {
			return nil, fmt.Errorf("payload: %w", err)
		}
		if c.model != nil {
			b.set("model", c.model)
		}
		b.set("stream", []byte(jsonTrue))
		b.set("stream_options", []byte(includeUsage))
	} else {
		if c.model != nil {
			b.set("model", c.model)
		}
		switch c.api {
		case APIChat:
			if req.PromptTokenIDs != nil {
				return nil, errors.New("a token-id prompt needs the completions API")
			}
			if len(req.Messages) == 0 {
				b.setText("messages", `[{"role":"user","content":`, req.Prompt, "}]")
			} else {
				msgs, err := rawArray(req.Messages)
				if err != nil {
					return nil, fmt.Errorf("messages: %w", err)
				}
				b.set("messages", msgs)
			}
			if len(req.Tools) > 0 {
				tools, err := rawArray(req.Tools)
				if err != nil {
					return nil, fmt.Errorf("tools: %w", err)
				}
				b.set("tools", tools)
			}
		case APICompletions:
			if req.Messages != nil {
				return nil, errors.New("chat messages need the chat API")
			}
			if req.PromptTokenIDs != nil {
				b.set("prompt", encodeTokenIDs(req.PromptTokenIDs))
			} else {
				b.setText("prompt", "", req.Prompt, "")
			}
		}
		b.set("stream", []byte(jsonTrue))
		b.set("stream_options", []byte(includeUsage))
		if req.MaxTokens > 0 {
			n := strconv.AppendInt(nil, int64(req.MaxTokens), 10)
			if c.api == APIChat {
				b.set(c.spec.Request.ChatMaxTokens, n)
			} else {
				b.set("max_tokens", n)
			}
			if c.spec.Request.NPredict {
				b.set("n_predict", n)
			}
			if c.spec.Request.IgnoreEOS {
				b.set("ignore_eos", []byte(jsonTrue))
			}
			if c.spec.Request.MinTokens {
				b.set("min_tokens", n)
			}
		}
	}
	for _, f := range c.extra {
		b.set(f.key, f.val)
	}
	if err := b.merge(req.Extra); err != nil {
		return nil, fmt.Errorf("extra: %w", err)
	}
	b.set("stream", []byte(jsonTrue))
	if c.salt != nil {
		b.put(*c.salt)
	}
	return b.pieces(), nil
}

// rawArray joins verbatim JSON values into an array, checking each is valid
// so a bad row fails here rather than as an opaque 400 from the server.
func rawArray(items []json.RawMessage) ([]byte, error) {
	n := 2
	for _, it := range items {
		n += len(it) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for i, it := range items {
		if !json.Valid(it) {
			return nil, fmt.Errorf("item %d is not valid JSON", i)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, bytes.TrimSpace(it)...)
	}
	return append(out, ']'), nil
}

func encodeTokenIDs(ids []int) []byte {
	out := make([]byte, 0, 2+len(ids)*7)
	out = append(out, '[')
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendInt(out, int64(id), 10)
	}
	return append(out, ']')
}
