// Package trace holds Mooncake trace rows: the Record, the streaming reader
// with its "file:line: reason" errors, and the compact columnar Table the
// daemon replays from. It is pure: no clocks, no network.
package trace

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// DefaultBlockSize is the Mooncake trace's hash block size in tokens.
const DefaultBlockSize = 512

// Record is one row of a Mooncake/AIPerf trace. Optional fields are pointers
// or nil slices so that "absent" and "zero" stay distinguishable; the writer
// emits exactly the fields that were present.
type Record struct {
	Timestamp    *float64 // ms, relative arrival time
	InputLength  *int     // tokens
	OutputLength *int     // tokens
	HashIDs      []int64  // ids of BlockSize-token prefix blocks
	SessionID    *string
	Delay        *float64 // ms of think time after the previous turn finished
	TextInput    *string
	Messages     []json.RawMessage // OpenAI chat messages, sent verbatim
	Tools        []json.RawMessage
	Payload      json.RawMessage // a whole request body, sent verbatim
	Extra        json.RawMessage // merged into the request body last
	Type         *string         // "mooncake_trace" when present

	// Unknown holds fields this program does not interpret, in file order,
	// so that synthesize writes them back untouched.
	Unknown []Field

	// Line is the 1-based line of the row in its file (0 if synthesized).
	Line int
}

// Field is one JSON member kept verbatim.
type Field struct {
	Key   string
	Value json.RawMessage
}

// ISL is the row's input_length, 0 when absent (as AIPerf's analyzer reads it).
func (r *Record) ISL() int {
	if r.InputLength == nil {
		return 0
	}
	return *r.InputLength
}

// OSL is the row's output_length, 0 when absent.
func (r *Record) OSL() int {
	if r.OutputLength == nil {
		return 0
	}
	return *r.OutputLength
}

// Clone returns a deep copy of the parts of r that synthesis rewrites.
func (r Record) Clone() Record {
	c := r
	if r.Timestamp != nil {
		v := *r.Timestamp
		c.Timestamp = &v
	}
	if r.InputLength != nil {
		v := *r.InputLength
		c.InputLength = &v
	}
	if r.OutputLength != nil {
		v := *r.OutputLength
		c.OutputLength = &v
	}
	if r.HashIDs != nil { // keep an empty list distinct from an absent one
		c.HashIDs = append(make([]int64, 0, len(r.HashIDs)), r.HashIDs...)
	}
	return c
}

// Ptr returns a pointer to v; handy for optional fields.
func Ptr[T any](v T) *T { return &v }

// AppendJSON appends r as one compact JSON object (no newline). Known fields
// come first in a fixed order, then unknown fields in their original order.
func (r *Record) AppendJSON(b []byte) []byte {
	b = append(b, '{')
	first := true
	key := func(k string) {
		if !first {
			b = append(b, ", "...)
		}
		first = false
		b = appendString(b, k)
		b = append(b, ": "...)
	}
	if r.Timestamp != nil {
		key("timestamp")
		b = appendNumber(b, *r.Timestamp)
	}
	if r.InputLength != nil {
		key("input_length")
		b = strconv.AppendInt(b, int64(*r.InputLength), 10)
	}
	if r.OutputLength != nil {
		key("output_length")
		b = strconv.AppendInt(b, int64(*r.OutputLength), 10)
	}
	if r.HashIDs != nil {
		key("hash_ids")
		b = append(b, '[')
		for i, h := range r.HashIDs {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = strconv.AppendInt(b, h, 10)
		}
		b = append(b, ']')
	}
	if r.SessionID != nil {
		key("session_id")
		b = appendString(b, *r.SessionID)
	}
	if r.Delay != nil {
		key("delay")
		b = appendNumber(b, *r.Delay)
	}
	if r.TextInput != nil {
		key("text_input")
		b = appendString(b, *r.TextInput)
	}
	if r.Messages != nil {
		key("messages")
		b = appendRawList(b, r.Messages)
	}
	if r.Tools != nil {
		key("tools")
		b = appendRawList(b, r.Tools)
	}
	if r.Payload != nil {
		key("payload")
		b = appendCompact(b, r.Payload)
	}
	if r.Extra != nil {
		key("extra")
		b = appendCompact(b, r.Extra)
	}
	if r.Type != nil {
		key("type")
		b = appendString(b, *r.Type)
	}
	for _, f := range r.Unknown {
		key(f.Key)
		b = appendCompact(b, f.Value)
	}
	return append(b, '}')
}

// MarshalJSON implements json.Marshaler.
func (r Record) MarshalJSON() ([]byte, error) { return r.AppendJSON(nil), nil }

// appendNumber writes integral values without a fraction or exponent, as
// trace files do, and others in the shortest form that round-trips.
func appendNumber(b []byte, f float64) []byte {
	if f == float64(int64(f)) && f < 1e18 && f > -1e18 {
		return strconv.AppendInt(b, int64(f), 10)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

func appendString(b []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			plain = false
			break
		}
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	enc, _ := json.Marshal(s) // a string always marshals
	return append(b, enc...)
}

func appendCompact(b []byte, raw json.RawMessage) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return append(b, raw...) // already validated by the reader
	}
	return append(b, buf.Bytes()...)
}

func appendRawList(b []byte, items []json.RawMessage) []byte {
	b = append(b, '[')
	for i, it := range items {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendCompact(b, it)
	}
	return append(b, ']')
}
