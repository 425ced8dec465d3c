package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"unicode/utf8"
)

// LineError is a problem with one line of a trace file. Its text has the
// compiler-style "file:line: reason" form.
type LineError struct {
	File string
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// ErrEmpty is returned by ReadFile for a file without a single row.
var ErrEmpty = errors.New("trace has no rows")

// ReadOptions tunes the checks the reader applies to each row.
type ReadOptions struct {
	// BlockSize, when positive, requires hash_ids to cover input_length:
	// at least ⌈input_length/BlockSize⌉ ids, and input_length ≥ 1. More ids
	// than that are accepted, as AIPerf's analyze-trace takes them; FitTable
	// and FitRecords keep the ids that fit, for what is sent. AIPerf checks
	// the blocks only when it builds a prompt; checking here names the line.
	BlockSize int
}

// Reader streams the rows of a JSONL trace. Lines of any length are read;
// blank lines are skipped.
type Reader struct {
	br   *bufio.Reader
	name string
	opts ReadOptions
	line int
	long []byte // holds a line longer than br's buffer
}

// NewReader reads rows from r; name is used in error messages.
func NewReader(r io.Reader, name string, opts ReadOptions) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 1<<16), name: name, opts: opts}
}

// Line returns the number of the last line read.
func (r *Reader) Line() int { return r.line }

// Next returns the next row, io.EOF after the last one, or a *LineError.
func (r *Reader) Next() (Record, error) {
	for {
		line, err := r.readLine()
		if err != nil {
			return Record{}, err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		rec, perr := ParseRecord(line, r.opts)
		if perr != nil {
			return Record{}, &LineError{File: r.name, Line: r.line, Err: perr}
		}
		rec.Line = r.line
		return rec, nil
	}
}

// readLine returns the next line without its terminator; the slice is valid
// until the next call.
func (r *Reader) readLine() ([]byte, error) {
	r.long = r.long[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		switch {
		case err == nil:
			r.line++
			if len(r.long) > 0 {
				r.long = append(r.long, chunk...)
				return r.long, nil
			}
			return chunk, nil
		case errors.Is(err, bufio.ErrBufferFull):
			r.long = append(r.long, chunk...)
		case errors.Is(err, io.EOF):
			r.long = append(r.long, chunk...)
			if len(r.long) == 0 {
				return nil, io.EOF
			}
			r.line++
			return r.long, nil
		default:
			return nil, fmt.Errorf("%s: read after line %d: %w", r.name, r.line, err)
		}
	}
}

// ReadFile reads every row of a trace file.
func ReadFile(path string, opts ReadOptions) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *PathError already names the file
	}
	defer f.Close()
	return ReadAll(f, path, opts)
}

// ReadAll reads every row from r; name is used in error messages.
func ReadAll(r io.Reader, name string, opts ReadOptions) ([]Record, error) {
	rd := NewReader(r, name, opts)
	var out []Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrEmpty)
	}
	return out, nil
}

// ParseRecord decodes and validates one JSON row.
func ParseRecord(line []byte, opts ReadOptions) (Record, error) {
	var rec Record
	if bytes.HasPrefix(line, utf8BOM) {
		return rec, errors.New("starts with a UTF-8 byte order mark (BOM); save the file as UTF-8 without one")
	}
	if !utf8.Valid(line) {
		return rec, fmt.Errorf("invalid UTF-8 at byte %d of the line", firstInvalidUTF8(line)+1)
	}
	err := eachMember(line, rec.setField)
	if err != nil {
		return rec, err
	}
	return rec, rec.Validate(opts.BlockSize)
}

var utf8BOM = []byte("\xef\xbb\xbf")

// firstInvalidUTF8 is the offset of the first byte of b that is not valid
// UTF-8, or -1.
func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// maxEcho bounds how much of a bad value an error message repeats: a line
// may be megabytes long, and the message goes to logs and HTTP replies.
const maxEcho = 40

// clip is raw for an error message, cut to maxEcho bytes.
func clip(raw []byte) string {
	if len(raw) <= maxEcho {
		return string(raw)
	}
	n := maxEcho
	for n > 0 && !utf8.RuneStart(raw[n]) {
		n-- // keep the message valid UTF-8
	}
	return fmt.Sprintf("%s… (%d bytes)", raw[:n], len(raw))
}

// eachMember calls set for every member of the JSON object in b, in order.
// It only finds where each value ends; values are checked by set. On a
// syntax error it defers to encoding/json for a precise message.
func eachMember(b []byte, set func(key string, raw json.RawMessage) error) error {
	bad := func() error {
		var v any
		err := json.Unmarshal(b, &v)
		if err == nil {
			return errors.New("invalid JSON: a row must be a JSON object")
		}
		return fmt.Errorf("invalid JSON: %w", err)
	}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return bad()
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		if skipSpace(b, i+1) != len(b) {
			return bad()
		}
		return nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return bad()
		}
		end := stringEnd(b, i)
		if end < 0 {
			return bad()
		}
		key, ok := plainKey(b[i+1 : end-1])
		if !ok { // escapes or control characters: let encoding/json judge
			if err := json.Unmarshal(b[i:end], &key); err != nil {
				return bad()
			}
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return bad()
		}
		i = skipSpace(b, i+1)
		end = valueEnd(b, i)
		// hash_ids is most of a trace's bytes; decodeHashIDs checks it.
		if end <= i || (key != "hash_ids" && !json.Valid(b[i:end])) {
			return bad()
		}
		if err := set(key, b[i:end]); err != nil {
			if errors.Is(err, errSyntax) {
				return bad()
			}
			return err
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return bad()
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			if skipSpace(b, i+1) != len(b) {
				return bad()
			}
			return nil
		default:
			return bad()
		}
	}
}

// plainKey returns k as a string when it needs no unescaping.
func plainKey(k []byte) (string, bool) {
	for _, c := range k {
		if c < 0x20 || c == '\\' {
			return "", false
		}
	}
	return string(k), true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string starting at b[i] == '"',
// or -1.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd returns the index just past the JSON value starting at b[i], or
// -1. It tracks nesting and strings only; json.Valid checks the rest.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j)
				if j < 0 {
					return -1
				}
				j--
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default:
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
			j++
		}
		return j
	}
}

var null = []byte("null")

// errSyntax tells eachMember that a value it did not check is not JSON.
var errSyntax = errors.New("invalid JSON")

// setField decodes one member into rec. Keys match exactly (case matters,
// as in AIPerf's pydantic model); a null value counts as absent.
func (rec *Record) setField(key string, raw json.RawMessage) error {
	isNull := bytes.Equal(raw, null)
	var err error
	switch key {
	case "timestamp":
		rec.Timestamp, err = decodeMillis(key, raw, isNull)
	case "delay":
		rec.Delay, err = decodeMillis(key, raw, isNull)
	case "input_length":
		rec.InputLength, err = decodeCount(key, raw, isNull)
	case "output_length":
		rec.OutputLength, err = decodeCount(key, raw, isNull)
	case "hash_ids":
		rec.HashIDs = nil
		if !isNull {
			rec.HashIDs, err = decodeHashIDs(raw)
			if err == nil && rec.HashIDs == nil {
				rec.HashIDs = []int64{}
			}
		}
	case "session_id":
		rec.SessionID, err = decodeString(key, raw, isNull)
	case "text_input":
		rec.TextInput, err = decodeString(key, raw, isNull)
	case "type":
		rec.Type, err = decodeString(key, raw, isNull)
	case "messages":
		rec.Messages, err = decodeList(key, raw, isNull)
	case "tools":
		rec.Tools, err = decodeList(key, raw, isNull)
	case "payload":
		rec.Payload, err = decodeObject(key, raw, isNull)
	case "extra":
		rec.Extra, err = decodeObject(key, raw, isNull)
	default:
		rec.Unknown = append(rec.Unknown, Field{Key: key, Value: append(json.RawMessage(nil), raw...)})
	}
	return err
}

// JSONKind names the JSON type of a value, for error messages.
func JSONKind(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "a list"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

func decodeMillis(key string, raw json.RawMessage, isNull bool) (*float64, error) {
	if isNull {
		return nil, nil
	}
	if JSONKind(raw) != "a number" {
		return nil, fmt.Errorf("%s: must be a number of milliseconds, got %s", key, JSONKind(raw))
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%s: number %s out of range", key, clip(raw))
	}
	if f < 0 {
		return nil, fmt.Errorf("%s: must be ≥ 0, got %s", key, clip(raw))
	}
	return &f, nil
}

// MaxCount bounds token counts: far above any model's context, far below
// anything that would overflow arithmetic on them. The reader rejects
// larger counts, and synthesis refuses to make them.
const MaxCount = 1 << 40

func decodeCount(key string, raw json.RawMessage, isNull bool) (*int, error) {
	if isNull {
		return nil, nil
	}
	if JSONKind(raw) != "a number" {
		return nil, fmt.Errorf("%s: must be an integer, got %s", key, JSONKind(raw))
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		// pydantic accepts floats with no fractional part, such as 512.0.
		f, ferr := strconv.ParseFloat(string(raw), 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) > MaxCount {
			if ferr == nil && f == math.Trunc(f) {
				return nil, fmt.Errorf("%s: %s is out of range", key, clip(raw))
			}
			var ne *strconv.NumError
			if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
				return nil, fmt.Errorf("%s: %s is out of range", key, clip(raw))
			}
			return nil, fmt.Errorf("%s: must be an integer, got %s", key, clip(raw))
		}
		n = int64(f)
	}
	if n < 0 {
		return nil, fmt.Errorf("%s: must be ≥ 0, got %d", key, n)
	}
	if n > MaxCount {
		return nil, fmt.Errorf("%s: %d is out of range", key, n)
	}
	v := int(n)
	return &v, nil
}

// decodeHashIDs parses a list of non-negative integers. The common case (a
// plain list of decimal integers) is scanned directly: it is most of the
// bytes of a Mooncake trace.
func decodeHashIDs(raw json.RawMessage) ([]int64, error) {
	if ids, ok := scanIntList(raw); ok {
		return ids, nil
	}
	if !json.Valid(raw) {
		return nil, errSyntax
	}
	if raw[0] != '[' {
		return nil, fmt.Errorf("hash_ids: must be a list of integers, got %s", JSONKind(raw))
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("hash_ids: %w", err)
	}
	ids := make([]int64, len(items))
	for i, it := range items {
		n, err := strconv.ParseInt(string(it), 10, 64)
		if err != nil {
			if JSONKind(it) == "a number" {
				return nil, fmt.Errorf("hash_ids[%d]: %s is not an integer in range", i, clip(it))
			}
			return nil, fmt.Errorf("hash_ids[%d]: must be an integer, got %s", i, JSONKind(it))
		}
		if n < 0 {
			return nil, fmt.Errorf("hash_ids[%d]: must be ≥ 0, got %d", i, n)
		}
		ids[i] = n
	}
	return ids, nil
}

// scanIntList reads `[1, 2, 3]` with optional spaces; ok is false on any
// other shape, leaving the caller to produce a precise error.
func scanIntList(raw []byte) (ids []int64, ok bool) {
	i, n := 0, len(raw)
	skip := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	if n < 2 || raw[0] != '[' {
		return nil, false
	}
	i = 1
	skip()
	if i < n && raw[i] == ']' {
		return []int64{}, i == n-1
	}
	ids = make([]int64, 0, bytes.Count(raw, []byte{','})+1)
	for {
		start := i
		var v int64
		for i < n && raw[i] >= '0' && raw[i] <= '9' {
			if v > (math.MaxInt64-9)/10 {
				return nil, false
			}
			v = v*10 + int64(raw[i]-'0')
			i++
		}
		if i == start || (i-start > 1 && raw[start] == '0') {
			return nil, false
		}
		ids = append(ids, v)
		skip()
		if i >= n {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i++
			skip()
		case ']':
			return ids, i == n-1
		default:
			return nil, false
		}
	}
}

func decodeString(key string, raw json.RawMessage, isNull bool) (*string, error) {
	if isNull {
		return nil, nil
	}
	if raw[0] != '"' {
		return nil, fmt.Errorf("%s: must be a string, got %s", key, JSONKind(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return &s, nil
}

func decodeList(key string, raw json.RawMessage, isNull bool) ([]json.RawMessage, error) {
	if isNull {
		return nil, nil
	}
	if raw[0] != '[' {
		return nil, fmt.Errorf("%s: must be a list, got %s", key, JSONKind(raw))
	}
	items := []json.RawMessage{}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return items, nil
}

func decodeObject(key string, raw json.RawMessage, isNull bool) (json.RawMessage, error) {
	if isNull {
		return nil, nil
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf("%s: must be an object, got %s", key, JSONKind(raw))
	}
	return append(json.RawMessage(nil), raw...), nil
}

// Validate applies AIPerf's row rules, plus the consistency of hash_ids and
// input_length when blockSize is positive.
func (rec *Record) Validate(blockSize int) error {
	modes := 0
	for _, set := range []bool{rec.InputLength != nil, rec.TextInput != nil, rec.Messages != nil, rec.Payload != nil} {
		if set {
			modes++
		}
	}
	switch {
	case modes == 0:
		return errors.New("exactly one of input_length, text_input, messages or payload must be given")
	case modes > 1:
		return errors.New("input_length, text_input, messages and payload are mutually exclusive; give only one")
	case rec.HashIDs != nil && rec.InputLength == nil:
		return errors.New("hash_ids is only allowed together with input_length")
	case rec.Payload != nil && isEmptyObject(rec.Payload):
		return errors.New("payload must be a non-empty object")
	case rec.Tools != nil && rec.Messages == nil:
		return errors.New("tools is only allowed together with messages")
	case rec.Tools != nil && len(rec.Tools) == 0:
		return errors.New("tools must be a non-empty list")
	case rec.Messages != nil && len(rec.Messages) == 0:
		return errors.New("messages must be a non-empty list")
	case rec.Type != nil && *rec.Type != "mooncake_trace":
		return fmt.Errorf("type: must be \"mooncake_trace\", got %q", clip([]byte(*rec.Type)))
	}
	for i, m := range rec.Messages {
		var msg map[string]json.RawMessage
		if err := json.Unmarshal(m, &msg); err != nil {
			return fmt.Errorf("messages[%d]: must be an object", i)
		}
		if _, ok := msg["role"]; !ok {
			return fmt.Errorf("messages[%d]: has no \"role\"", i)
		}
	}
	for i, t := range rec.Tools {
		if len(t) == 0 || t[0] != '{' {
			return fmt.Errorf("tools[%d]: must be an object", i)
		}
	}
	if blockSize > 0 && len(rec.HashIDs) > 0 {
		n, isl := len(rec.HashIDs), *rec.InputLength
		if need := FittingIDs(isl, blockSize); isl < 1 || need > n {
			return &blocksError{isl: isl, ids: n, blockSize: blockSize, need: need}
		}
	}
	return nil
}

func isEmptyObject(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
}
