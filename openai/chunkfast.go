package openai

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// Most chunks of a stream differ from the one before only in the text of
// delta.content: the id, model, created time and the rest are the same
// bytes. chunkTemplate remembers such a chunk, fully parsed, as the bytes
// before and after its content string; a later chunk made of the same
// bytes around a well-formed JSON string is then the same document with
// other text, and all handle needs of it is whether that text is empty.
// This skips the parse of nearly every chunk (BenchmarkSSEParseChunk);
// anything else (another shape, usage, a finish_reason, an error) does not
// match and is parsed in full.

var contentKey = []byte(`"content":"`)

type chunkTemplate struct {
	valid  bool
	prefix []byte // up to and including the content string's opening quote
	suffix []byte // from its closing quote to the end
}

func (t *chunkTemplate) clear() { t.valid, t.prefix, t.suffix = false, t.prefix[:0], t.suffix[:0] }

// match reports whether data is the template with another content string,
// and whether that string is empty.
func (t *chunkTemplate) match(data []byte) (empty, ok bool) {
	if !t.valid || len(data) < len(t.prefix)+len(t.suffix) || !bytes.HasPrefix(data, t.prefix) {
		return false, false
	}
	rest := data[len(t.prefix):]
	end, ok := jsonStringEnd(rest)
	if !ok || !bytes.Equal(rest[end:], t.suffix) {
		return false, false
	}
	return end == 0, true
}

// learn makes data the template if it qualifies: a parsed chunk whose
// whole effect on the stream is whether its one delta.content is empty.
// obj is data parsed.
func (t *chunkTemplate) learn(data []byte, obj *fastjson.Object) {
	t.valid = false
	if obj.Get("usage") != nil || obj.Get("timings") != nil || obj.Get("metrics") != nil || obj.Get("error") != nil {
		return
	}
	if o := obj.Get("object"); o != nil && string(o.GetStringBytes()) == "error" {
		return
	}
	ch := obj.Get("choices")
	if ch == nil {
		return // fastjson's Array is not nil-safe
	}
	choices, err := ch.Array()
	if err != nil || len(choices) != 1 || choices[0].Type() != fastjson.TypeObject {
		return
	}
	c := choices[0]
	if c.Get("text") != nil {
		return
	}
	if fr := c.Get("finish_reason"); fr != nil && fr.Type() != fastjson.TypeNull &&
		(fr.Type() != fastjson.TypeString || len(fr.GetStringBytes()) > 0) {
		return
	}
	d := c.Get("delta")
	if d == nil || d.Type() != fastjson.TypeObject || d.Get("reasoning_content") != nil || d.Get("reasoning") != nil || d.Get("tool_calls") != nil {
		return
	}
	if v := d.Get("content"); v == nil || v.Type() != fastjson.TypeString {
		return
	}
	// The raw key must occur once: a second "content":" (another object's,
	// or a duplicate key) would make the split ambiguous. Inside a string
	// the sequence cannot occur unescaped.
	i := bytes.Index(data, contentKey)
	if i < 0 || bytes.Contains(data[i+len(contentKey):], contentKey) {
		return
	}
	start := i + len(contentKey)
	end, ok := jsonStringEnd(data[start:])
	if !ok {
		return
	}
	t.prefix = append(t.prefix[:0], data[:start]...)
	t.suffix = append(t.suffix[:0], data[start+end:]...)
	t.valid = true
}

// jsonStringEnd returns the index of the quote that closes the JSON string
// whose body b starts with; ok is false unless the body is well formed
// (valid escapes, no raw control characters).
func jsonStringEnd(b []byte) (end int, ok bool) {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			i++
			if i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
					return 0, false
				}
				i += 4
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
