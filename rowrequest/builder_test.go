package rowrequest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
	"github.com/kvload-exporter/kvload-exporter/tokenizer/tokenizertest"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// TestBuilderBuild: a row's own payload, messages or text go out as
// they are; otherwise the prompt is built, as text or token ids, short of
// the chat template's room; the session is the row's session_id or one of
// its own; max_tokens is the output length, never 0.
func TestBuilderBuild(t *testing.T) {
	pb, err := prompt.NewBuilder(prompt.Options{BlockSize: 4, Seed: 1, Tokenizer: tokenizertest.Load(t, tokenizer.O200kBase)})
	if err != nil {
		t.Fatal(err)
	}
	num := func(n int) *int { return &n }
	str := func(s string) *string { return &s }
	rowOf := func(isl int) trace.Record {
		return trace.Record{InputLength: num(isl), OutputLength: num(3), HashIDs: []int64{1, 2}, Line: 7}
	}
	payload := json.RawMessage(`{"prompt":"as recorded"}`)
	messages := []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}
	for _, tc := range []struct {
		name    string
		b       Builder
		rec     trace.Record
		row     int
		session string // "" where the target sends none
		max     int
		text    string // the prompt sent as text, "*" for a built one
		built   int    // the tokens built
		ids     int    // the token ids sent
	}{
		{name: "built text", b: Builder{}, rec: rowOf(7), max: 3, text: "*", built: 7},
		{name: "built text leaves the template room", b: Builder{TemplateRoom: func() int { return 2 }}, rec: rowOf(7), max: 3, text: "*", built: 5},
		{name: "token ids", b: Builder{TokenIDs: true}, rec: rowOf(7), max: 3, built: 7, ids: 7},
		{name: "session of the line", b: Builder{Sessions: true}, rec: rowOf(7), session: "row-7", max: 3, text: "*", built: 7},
		{name: "session of the place without a line", b: Builder{Sessions: true},
			rec: trace.Record{InputLength: num(4), HashIDs: []int64{1}}, row: 4, session: "row-5", text: "*", built: 4},
		{name: "session_id", b: Builder{Sessions: true},
			rec: trace.Record{InputLength: num(4), OutputLength: num(0), HashIDs: []int64{1}, SessionID: str("s1")}, session: "s1", max: 1, text: "*", built: 4},
		{name: "text input", b: Builder{TokenIDs: true}, rec: trace.Record{TextInput: str("as written"), OutputLength: num(9)}, max: 9, text: "as written"},
		{name: "messages", b: Builder{}, rec: trace.Record{Messages: messages}},
		{name: "payload", b: Builder{Sessions: true}, rec: trace.Record{Payload: payload, Line: 2}, session: "row-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			b.Prompts = pb
			req, err := b.Build(&tc.rec, tc.row, 0)
			if err != nil {
				t.Fatal(err)
			}
			if req.Session != tc.session || req.MaxTokens != tc.max || req.BuiltTokens != tc.built || len(req.PromptTokenIDs) != tc.ids {
				t.Errorf("session %q, max_tokens %d, built %d, %d ids; want %q, %d, %d, %d",
					req.Session, req.MaxTokens, req.BuiltTokens, len(req.PromptTokenIDs), tc.session, tc.max, tc.built, tc.ids)
			}
			switch tc.text {
			case "*":
				if words := strings.Count(req.Prompt, " "); words != tc.built {
					t.Errorf("prompt of %d words, want %d: %q", words, tc.built, req.Prompt)
				}
			default:
				if req.Prompt != tc.text {
					t.Errorf("prompt %q, want %q", req.Prompt, tc.text)
				}
			}
			if string(req.Payload) != string(tc.rec.Payload) || len(req.Messages) != len(tc.rec.Messages) {
				t.Errorf("payload %s and %d messages, want the row's %s and %d", req.Payload, len(req.Messages), tc.rec.Payload, len(tc.rec.Messages))
			}
		})
	}
}

// BenchmarkBuildRequest builds the prompt of a 3,000-token row whose six
// blocks are cached, as a replay does after its first pass: what each
// request allocates for its prompt.
func BenchmarkBuildRequest(b *testing.B) {
	pb, err := prompt.NewBuilder(prompt.Options{BlockSize: 512, Seed: 1, CacheBytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	isl, osl := 3000, 128
	rec := &trace.Record{InputLength: &isl, OutputLength: &osl, HashIDs: []int64{1, 2, 3, 4, 5, 6}, Line: 1}
	rb := &Builder{Prompts: pb}
	if _, err := rb.Build(rec, 0, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req, err := rb.Build(rec, 0, 0)
		if err != nil || req.BuiltTokens != isl {
			b.Fatalf("built %d tokens, %v", req.BuiltTokens, err)
		}
	}
}
