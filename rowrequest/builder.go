// Package rowrequest turns a trace row into the request sent for it to one
// target: the row's own payload, messages or text where it carries them,
// else the prompt package's prompt for its hash ids, with its session and
// max_tokens. It sits beside prompt rather than in it because the emulator,
// which the tests of the packages below openai use, imports prompt: prompt
// importing openai would close an import cycle in those tests.
package rowrequest

import (
	"strconv"
	"unsafe"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// Builder turns trace rows into requests for one target. It implements
// replay.RequestBuilder.
type Builder struct {
	// Prompts builds the prompts of rows that carry none of their own.
	Prompts *prompt.Builder
	// Sessions: the target has a session header, which each request's
	// session fills.
	Sessions bool
	// TokenIDs sends token-id prompts, built with Prompts' tokenizer.
	TokenIDs bool
	// TemplateRoom, on chat, is the room the server's chat template takes
	// (in tokens, as learnt so far), left off the end of built prompts;
	// nil on completions, whose prompt the server takes as it is.
	TemplateRoom func() int
}

// Generation changes whenever a request built now could differ from one
// built before for the same row: it is the chat template's room, the one
// thing Build learns as the run goes (replay.RequestBuilder).
func (b *Builder) Generation() uint64 {
	if b.TemplateRoom == nil {
		return 0
	}
	return uint64(b.TemplateRoom())
}

// Build returns the request of row (its index in the trace) under the
// hash-id namespace ns.
func (b *Builder) Build(rec *trace.Record, row int, ns uint64) (openai.Request, error) {
	req := openai.Request{Extra: rec.Extra}
	if b.Sessions {
		req.Session = sessionOf(rec, row)
	}
	if rec.OutputLength != nil {
		req.MaxTokens = max(*rec.OutputLength, 1) // 0 would mean "server default"
	}
	var err error
	switch {
	case rec.Payload != nil:
		req.Payload = rec.Payload
	case rec.Messages != nil:
		req.Messages, req.Tools = rec.Messages, rec.Tools
	case rec.TextInput != nil:
		req.Prompt = *rec.TextInput
	case b.TokenIDs:
		req.PromptTokenIDs, err = b.Prompts.AppendTokenIDs(nil, rec, ns, uint64(rec.Line))
		req.BuiltTokens = len(req.PromptTokenIDs)
	default:
		room := 0
		if b.TemplateRoom != nil {
			room = b.TemplateRoom()
		}
		var text []byte
		// The builder sizes the buffer from its words' lengths.
		text, req.BuiltTokens, err = b.Prompts.AppendTextRoom(nil, rec, ns, uint64(rec.Line), room)
		// The buffer is this request's alone and never written again, so
		// the prompt shares it instead of copying it.
		req.Prompt = unsafe.String(unsafe.SliceData(text), len(text))
	}
	return req, err
}

// sessionOf is the session a row's request carries: its session_id, else
// an id of its own, "row-" and its line in the trace (its 1-based place
// where the row has no line).
func sessionOf(rec *trace.Record, row int) string {
	if rec.SessionID != nil {
		return *rec.SessionID
	}
	line := rec.Line
	if line == 0 {
		line = row + 1
	}
	return "row-" + strconv.Itoa(line)
}
