package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRecordErrors(t *testing.T) {
	tests := []struct {
		name string
		line string
		want string // substring of the error
	}{
		{"not json", `{"input_length": 5,`, "invalid JSON"},
		{"truncated", `{"input_length": 5`, "invalid JSON"},
		{"array row", `[1, 2]`, "must be a JSON object"},
		{"trailing text", `{"input_length": 5} x`, "invalid JSON"},
		{"no input mode", `{"output_length": 5}`, "exactly one of input_length"},
		{"two input modes", `{"input_length": 5, "text_input": "hi"}`, "mutually exclusive"},
		{"string length", `{"input_length": "abc"}`, "input_length: must be an integer, got a string"},
		{"fractional length", `{"input_length": 5.5}`, "input_length: must be an integer"},
		{"negative input", `{"input_length": -1}`, "input_length: must be ≥ 0"},
		{"negative output", `{"input_length": 1, "output_length": -3}`, "output_length: must be ≥ 0"},
		{"huge length", `{"input_length": 99999999999999999999999}`, "out of range"},
		{"huge float length", `{"input_length": 1e300}`, "out of range"},
		{"huge timestamp", `{"input_length": 1, "timestamp": 1e999}`, "timestamp: number 1e999 out of range"},
		{"negative timestamp", `{"input_length": 1, "timestamp": -5}`, "timestamp: must be ≥ 0"},
		{"negative delay", `{"input_length": 1, "delay": -1}`, "delay: must be ≥ 0"},
		{"string timestamp", `{"input_length": 1, "timestamp": "0"}`, "timestamp: must be a number"},
		{"hash ids not list", `{"input_length": 1, "hash_ids": 3}`, "hash_ids: must be a list"},
		{"hash id string", `{"input_length": 1, "hash_ids": ["a"]}`, "hash_ids[0]: must be an integer"},
		{"hash id negative", `{"input_length": 1, "hash_ids": [0, -2]}`, "hash_ids[1]: must be ≥ 0"},
		{"hash id float", `{"input_length": 1, "hash_ids": [1.5]}`, "hash_ids[0]"},
		{"hash ids without length", `{"text_input": "x", "hash_ids": [1]}`, "hash_ids is only allowed together with input_length"},
		{"too few blocks", `{"input_length": 1100, "hash_ids": [1, 2]}`, "does not fit 2 hash_ids"},
		{"ids with zero length", `{"input_length": 0, "hash_ids": [1]}`, "does not fit 1 hash_ids"},
		{"numeric session", `{"input_length": 1, "session_id": 7}`, "session_id: must be a string"},
		{"empty payload", `{"payload": {}}`, "payload must be a non-empty object"},
		{"payload not object", `{"payload": [1]}`, "payload: must be an object"},
		{"empty messages", `{"messages": []}`, "messages must be a non-empty list"},
		{"message without role", `{"messages": [{"content": "x"}]}`, "messages[0]: has no \"role\""},
		{"message not object", `{"messages": ["x"]}`, "messages[0]: must be an object"},
		{"tools without messages", `{"input_length": 3, "tools": [{"type": "function"}]}`, "tools is only allowed together with messages"},
		{"empty tools", `{"messages": [{"role": "user"}], "tools": []}`, "tools must be a non-empty list"},
		{"wrong type tag", `{"input_length": 1, "type": "sharegpt"}`, "type: must be \"mooncake_trace\""},
		{"nul byte in key", "{\"input_length\x00\": 1}", "invalid JSON"},
		{"invalid utf8", "{\"input_length\": 1, \"x\": \"\xff\"}", "invalid UTF-8 at byte 27 of the line"},
		{"byte order mark", "\xef\xbb\xbf{\"input_length\": 1}", "byte order mark"},
		{"long value clipped", `{"input_length": 1, "type": "` + strings.Repeat("é", 100) + `"}`, `got "` + strings.Repeat("é", 20) + `… (200 bytes)"`},
		{"long number clipped", `{"input_length": 1` + strings.Repeat("0", 100) + `}`, "input_length: 1" + strings.Repeat("0", 39) + "… (101 bytes) is out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRecord([]byte(tt.line), ReadOptions{BlockSize: 512})
			if err == nil {
				t.Fatalf("ParseRecord(%s) succeeded, want error containing %q", tt.line, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseRecord(%s) = %q, want it to contain %q", tt.line, err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
}

func TestParseRecordAccepts(t *testing.T) {
	tests := []struct {
		name  string
		line  string
		check func(t *testing.T, r Record)
	}{
		{"mooncake row", `{"timestamp": 27, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}`, func(t *testing.T, r Record) {
			if *r.Timestamp != 27 || r.ISL() != 1100 || r.OSL() != 7 || len(r.HashIDs) != 3 || r.HashIDs[2] != 2 {
				t.Errorf("got %+v", r)
			}
		}},
		{"integral float length", `{"input_length": 512.0, "hash_ids": [4]}`, func(t *testing.T, r Record) {
			if r.ISL() != 512 {
				t.Errorf("ISL = %d", r.ISL())
			}
		}},
		{"nulls are absent", `{"input_length": 3, "output_length": null, "hash_ids": null, "session_id": null}`, func(t *testing.T, r Record) {
			if r.OutputLength != nil || r.HashIDs != nil || r.SessionID != nil {
				t.Errorf("got %+v", r)
			}
		}},
		{"empty hash ids", `{"input_length": 3, "hash_ids": []}`, func(t *testing.T, r Record) {
			if r.HashIDs == nil || len(r.HashIDs) != 0 {
				t.Errorf("HashIDs = %#v, want empty non-nil", r.HashIDs)
			}
		}},
		{"spaced hash ids", `{"input_length": 600, "hash_ids": [ 1 ,2 ]}`, func(t *testing.T, r Record) {
			if len(r.HashIDs) != 2 || r.HashIDs[1] != 2 {
				t.Errorf("HashIDs = %v", r.HashIDs)
			}
		}},
		{"case matters", `{"input_length": 3, "Timestamp": 9}`, func(t *testing.T, r Record) {
			if r.Timestamp != nil || len(r.Unknown) != 1 || r.Unknown[0].Key != "Timestamp" {
				t.Errorf("got %+v", r)
			}
		}},
		{"messages and tools", `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}], "session_id": "s1", "delay": 1.5}`, func(t *testing.T, r Record) {
			if len(r.Messages) != 1 || len(r.Tools) != 1 || *r.SessionID != "s1" || *r.Delay != 1.5 {
				t.Errorf("got %+v", r)
			}
		}},
		{"escaped key", `{"input_length": 3, "a\"b": 1}`, func(t *testing.T, r Record) {
			if len(r.Unknown) != 1 || r.Unknown[0].Key != `a"b` {
				t.Errorf("got %+v", r.Unknown)
			}
		}},
		{"ids to spare", `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}`, func(t *testing.T, r Record) {
			if r.ISL() != 655 || len(r.HashIDs) != 3 { // AIPerf's documentation row, kept whole
				t.Errorf("got %+v", r)
			}
		}},
		{"payload", `{"payload": {"model": "m", "prompt": "x"}, "type": "mooncake_trace"}`, nil},
		{"text input", `{"text_input": "hello", "extra": {"nvext": {"a": 1}}}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRecord([]byte(tt.line), ReadOptions{BlockSize: 512})
			if err != nil {
				t.Fatalf("ParseRecord: %v", err)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

// TestRecordRoundTrip checks that writing a row back keeps every field,
// unknown ones included, in a form the reader reads back identically.
func TestRecordRoundTrip(t *testing.T) {
	lines := []string{
		`{"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, 15]}`,
		`{"timestamp": 12.5, "input_length": 3, "session_id": "s\"1", "delay": 250, "zeta": {"b": [1, 2]}, "alpha": "ünï"}`,
		`{"messages": [{"role": "user", "content": "a\nb"}], "tools": [{"type": "function"}], "extra": {"k": true}}`,
		`{"payload": {"model": "m"}, "type": "mooncake_trace", "custom": null}`,
	}
	for _, line := range lines {
		r1, err := ParseRecord([]byte(line), ReadOptions{})
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		out := r1.AppendJSON(nil)
		r2, err := ParseRecord(out, ReadOptions{})
		if err != nil {
			t.Fatalf("re-read %s: %v", out, err)
		}
		if again := r2.AppendJSON(nil); !bytes.Equal(again, out) {
			t.Errorf("not stable:\n%s\n%s", out, again)
		}
		if line == lines[0] && string(out) != line {
			t.Errorf("Mooncake row changed shape:\n got %s\nwant %s", out, line)
		}
		if len(r1.Unknown) != len(r2.Unknown) {
			t.Errorf("unknown fields lost: %s", out)
		}
	}
}

func TestReaderLinesAndErrors(t *testing.T) {
	long := `{"input_length": 1, "pad": "` + strings.Repeat("x", 5<<20) + `"}`
	input := "\n" +
		`{"input_length": 1}` + "\r\n" +
		"   \n" +
		long + "\n" +
		`{"input_length": 2}` // no final newline
	recs, err := ReadAll(strings.NewReader(input), "t.jsonl", ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("got %d rows, want 3", len(recs))
	}
	for i, want := range []int{2, 4, 5} {
		if recs[i].Line != want {
			t.Errorf("row %d: line %d, want %d", i, recs[i].Line, want)
		}
	}
	if got := len(recs[1].Unknown[0].Value); got != 5<<20+2 {
		t.Errorf("long field has %d bytes", got)
	}

	_, err = ReadAll(strings.NewReader("{\"input_length\": 1}\n\n{\"input_length\": x}\n"), "t.jsonl", ReadOptions{})
	var le *LineError
	if !errors.As(err, &le) || le.Line != 3 || !strings.HasPrefix(err.Error(), "t.jsonl:3: invalid JSON") {
		t.Fatalf("err = %v, want t.jsonl:3: invalid JSON...", err)
	}

	_, err = ReadAll(strings.NewReader("\n \n"), "e.jsonl", ReadOptions{})
	if !errors.Is(err, ErrEmpty) || !strings.HasPrefix(err.Error(), "e.jsonl: ") {
		t.Fatalf("err = %v, want empty-trace error naming the file", err)
	}
}

func TestReadFileMissing(t *testing.T) {
	_, err := ReadFile(filepath.Join(t.TempDir(), "nope.jsonl"), ReadOptions{})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.jsonl") {
		t.Fatalf("err = %v", err)
	}
}

func TestReaderStreamsSharedTraces(t *testing.T) {
	for _, tc := range []struct {
		file string
		rows int
	}{
		{"conversation_trace.jsonl", 12031},
		{"synthetic_trace.jsonl", 3993},
	} {
		f, err := os.Open(sharedTraceFile(t, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		rd := NewReader(f, tc.file, ReadOptions{BlockSize: DefaultBlockSize})
		n := 0
		for {
			rec, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.Timestamp == nil || rec.InputLength == nil || rec.OutputLength == nil || len(rec.HashIDs) == 0 {
				t.Fatalf("%s:%d: missing a Mooncake field: %+v", tc.file, rec.Line, rec)
			}
			n++
		}
		f.Close()
		if n != tc.rows {
			t.Errorf("%s: %d rows, want %d", tc.file, n, tc.rows)
		}
	}
}

// sharedTraceFile returns the path of one of the shared, read-only traces.
func sharedTraceFile(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join("..", "testdata", "mooncake", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("Mooncake trace missing from testdata/mooncake: %v", err)
	}
	return p
}

// conversationRows is the number of rows of the shared conversation trace.
const conversationRows = 12031

func readSharedBytes(b *testing.B, name string) []byte {
	b.Helper()
	data, err := os.ReadFile(sharedTraceFile(b, name))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}], "session_id": "s"}`,
		`{"payload": {"a": 1}}`,
		`{"text_input": "x\u00e9", "delay": 3.5, "zz": [1, {"q": null}]}`,
		`{"input_length": 1e3, "hash_ids": [ 1 , 2 ]}`,
		`{"input_length": 5`,
		`{"a\"b": 1, "input_length": 1}`,
		`{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		rec, err := ParseRecord(line, ReadOptions{BlockSize: 512})
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		// Anything accepted must survive a write and a re-read unchanged.
		out := rec.AppendJSON(nil)
		rec2, err := ParseRecord(out, ReadOptions{BlockSize: 512})
		if err != nil {
			t.Fatalf("re-read of %s failed: %v (from %q)", out, err, line)
		}
		if again := rec2.AppendJSON(nil); !bytes.Equal(again, out) {
			t.Fatalf("write not stable:\n%s\n%s", out, again)
		}
		// The ids a prompt is built from are exactly those that fit.
		fit := []Record{rec.Clone()}
		FitRecords(fit, 512)
		if n := len(fit[0].HashIDs); n > 0 && n != FittingIDs(fit[0].ISL(), 512) {
			t.Fatalf("%d ids fit %d tokens after FitRecords (from %q)", n, fit[0].ISL(), line)
		}
	})
}

// FuzzReadAll feeds whole files to the streaming reader: whatever the bytes
// (several lines, blank lines, CR LF, NUL, invalid UTF-8, no final newline),
// it returns rows or one error that names the file and a line number.
func FuzzReadAll(f *testing.F) {
	for _, s := range []string{
		"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n\n{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [0, 1]}\n",
		"{\"timestamp\": 0, \"input_length\": 10}\r\n{\"timestamp\": 1, \"input_length\": 3}",
		"{\"timestamp\": -1}\n",
		"\x00\n",
		"{\"text_input\": \"\xff\xfe\"}\n",
		"{\"session_id\": \"a\", \"delay\": 10, \"input_length\": 1}\n{\"session_id\": \"a\", \"delay\": 10, \"input_length\": 1}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ReadAll(bytes.NewReader(data), "fuzz.jsonl", ReadOptions{BlockSize: 512})
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "fuzz.jsonl") {
				t.Fatalf("error does not name the file: %q", msg)
			}
			return
		}
		for i, r := range recs {
			if r.Line < 1 || (i > 0 && r.Line <= recs[i-1].Line) {
				t.Fatalf("row %d has line %d after %d", i, r.Line, recs[max(i-1, 0)].Line)
			}
		}
	})
}

func BenchmarkReadConversationRows(b *testing.B) {
	data, err := os.ReadFile(sharedTraceFile(b, "conversation_trace.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	rows := 0
	for b.Loop() {
		recs, err := ReadAll(bytes.NewReader(data), "conversation_trace.jsonl", ReadOptions{BlockSize: DefaultBlockSize})
		if err != nil {
			b.Fatal(err)
		}
		rows += len(recs)
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkReadConversation measures the reader alone on the 12,031-row
// conversation trace, held in memory so that the disk does not count.
func BenchmarkReadConversation(b *testing.B) {
	data := readSharedBytes(b, "conversation_trace.jsonl")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		rd := NewReader(bytes.NewReader(data), "conversation_trace.jsonl", ReadOptions{BlockSize: DefaultBlockSize})
		n := 0
		for {
			_, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != conversationRows {
			b.Fatalf("read %d rows, want %d", n, conversationRows)
		}
	}
	b.ReportMetric(float64(conversationRows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}
