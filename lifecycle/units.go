package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// promptCacheBytes bounds each workload's block cache of prompt text. It
// saves rebuilding a block (5 µs for 512 tokens) only while the block is
// reused soon; 8 MiB holds some 2,400 such blocks, a million tokens.
const promptCacheBytes = 8 << 20

// workloadData is a workload's trace, read and synthesized once and shared
// by all its targets (and by other workloads of the same trace and knobs).
type workloadData struct {
	trace   *tracePlan
	builder *prompt.Builder
	// note, when not empty, is a warning about the trace that the daemon
	// logs once and --config.check prints.
	note string
}

// rows is the number of rows the workload replays.
func (wd *workloadData) rows() int { return wd.trace.plan.Rows().Len() }

// loadWorkload returns a workload's trace, reshaped, from traces (which
// reads the file only if prev does not hold it already). Errors name the
// file and line.
func loadWorkload(ctx context.Context, cfg *config.Config, w *config.Workload, traces, prev *traceCache) (*workloadData, error) {
	k := synth.Knobs{
		BlockSize:            w.BlockSize,
		SpeedupRatio:         w.Synthesis.SpeedupRatio,
		PrefixLenMultiplier:  w.Synthesis.PrefixLenMultiplier,
		PrefixRootMultiplier: w.Synthesis.PrefixRootMultiplier,
		PromptLenMultiplier:  w.Synthesis.PromptLenMultiplier,
		OutputLenMultiplier:  w.Synthesis.OutputLenMultiplier,
		MaxISL:               w.Synthesis.MaxISL,
		MaxOSL:               w.Synthesis.MaxOSL,
		Seed:                 w.Seed,
	}
	path := cfg.TracePath(w)
	if g := w.SharedPrefix(); g != nil {
		path = generatedName(g)
	}
	tp, err := traces.plan(ctx, prev, path, w, k)
	if ae := (*traceAccessError)(nil); errors.As(err, &ae) {
		// The file could not be read at all: name the YAML key and line,
		// and where relative paths resolve.
		return nil, cfg.TraceError(w, ae.err)
	}
	if errors.Is(err, trace.ErrTooFewHashIDs) {
		return nil, fmt.Errorf("%w; %s is %d tokens: it must be the block size the trace's hash_ids were made with",
			err, blockSizeKey(cfg, w), w.BlockSize)
	}
	if err != nil {
		return nil, err
	}
	builder, err := prompt.NewBuilder(prompt.Options{BlockSize: w.BlockSize, Seed: w.Seed, CacheBytes: promptCacheBytes})
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", w.Name, err)
	}
	wd := &workloadData{trace: tp, builder: builder}
	if sp := tp.file.surplus; sp.Rows > 0 {
		wd.note = fmt.Sprintf("workload %s: %s: %s; their prompts use the ids that fit. Is %s (%d) the block size the trace was made with?",
			w.Name, path, sp, blockSizeKey(cfg, w), w.BlockSize)
	}
	return wd, nil
}

// blockSizeKey is the YAML path of w's block_size, for messages.
func blockSizeKey(cfg *config.Config, w *config.Workload) string {
	for i := range cfg.Workloads {
		if &cfg.Workloads[i] == w {
			return fmt.Sprintf("workloads[%d].block_size", i)
		}
	}
	return "block_size"
}

// ctxReader fails its reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// maxRequestTokens bounds a row's input and output lengths: above any
// model's context, below what building the prompt text could allocate.
const maxRequestTokens = 1 << 24

// checkSendable rejects a row no request can be built for.
func checkSendable(rows *trace.Table, i int) error {
	if n := rows.ISL(i); n > maxRequestTokens {
		return fmt.Errorf("input_length %d is more than the %d tokens a request may have", n, maxRequestTokens)
	}
	if n := rows.OSL(i); n > maxRequestTokens {
		return fmt.Errorf("output_length %d is more than the %d tokens a request may have", n, maxRequestTokens)
	}
	return nil
}

// fileKind describes a file that is not a regular one.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "is a directory"
	case m&os.ModeNamedPipe != 0:
		return "is a named pipe"
	case m&os.ModeDevice != 0:
		return "is a device"
	case m&os.ModeSocket != 0:
		return "is a socket"
	default:
		return "is special"
	}
}

// requestBuilder turns trace rows into requests for one target.
type requestBuilder struct {
	prompts *prompt.Builder
	// sessions: the target has a session header, which each request's
	// session fills.
	sessions bool
	// tokenIDs sends token-id prompts, built with the target's tokenizer.
	tokenIDs bool
	// template, on chat, is the room the server's chat template takes,
	// left off the end of built prompts; nil on completions, whose prompt
	// the server takes as it is.
	template *templateOverhead
}

// Build implements replay.RequestBuilder.
func (b *requestBuilder) Build(rec *trace.Record, row int, ns uint64) (openai.Request, error) {
	req := openai.Request{Extra: rec.Extra}
	if b.sessions {
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
	case b.tokenIDs:
		req.PromptTokenIDs, err = b.prompts.AppendTokenIDs(nil, rec, ns, uint64(rec.Line))
		req.BuiltTokens = len(req.PromptTokenIDs)
	default:
		room := 0
		if b.template != nil {
			room = b.template.get()
		}
		var text []byte
		// The builder sizes the buffer from its words' lengths.
		text, req.BuiltTokens, err = b.prompts.AppendTextRoom(nil, rec, ns, uint64(rec.Line), room)
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

// gatedObserver forwards to the cache-truth step in front of the collector
// until closed. A unit that a reload
// changed or removed has its series deleted at once; the requests it still
// has in flight finish, but must not recreate those series. close waits
// for a call under way, so that none lands after the series are deleted.
type gatedObserver struct {
	obs      replay.Observer   // the cache-truth step
	fails    *failureLog       // nil: failures are only counted
	template *templateOverhead // nil: nothing to learn
	watch    *layoutWatch      // nil: the target's layout is not read
	misses   *missOffer        // nil: the target's KV events are not followed
	salt     string            // the unit's cache salt, "" for none: its missed blocks are looked up under it
	mu       sync.RWMutex
	closed   bool
}

// close stops forwarding; when it returns no call is forwarding any more.
func (g *gatedObserver) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// open takes the gate for one call; done releases it.
func (g *gatedObserver) open() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	return true
}

func (g *gatedObserver) done() { g.mu.RUnlock() }

func (g *gatedObserver) Sent(w, t string, scheduled, sent time.Time) {
	if g.open() {
		defer g.done()
		g.obs.Sent(w, t, scheduled, sent)
	}
}

func (g *gatedObserver) Finished(r *replay.Result) {
	if g.open() {
		defer g.done()
		g.obs.Finished(r)
		if g.misses != nil {
			g.misses.offer(r, g.salt) // r.Counted is filled now
		}
		if g.watch != nil && targetAnswered(r.Outcome) {
			g.watch.answered()
		}
		if g.template != nil {
			g.template.observe(r)
		}
		if g.fails != nil {
			g.fails.finished(r)
		}
	}
}

// targetAnswered tells whether a request's outcome says that its target
// answered it, successfully or not.
func targetAnswered(o openai.Outcome) bool {
	switch o {
	case openai.OutcomeSuccess, openai.OutcomeHTTPError, openai.OutcomeStreamError:
		return true
	}
	return false
}

func (g *gatedObserver) Dropped(w, t string, reason replay.DropReason, scheduled time.Time) {
	if g.open() {
		defer g.done()
		g.obs.Dropped(w, t, reason, scheduled)
	}
}

func (g *gatedObserver) PassCompleted(w, t string, pass int) {
	if g.open() {
		defer g.done()
		g.obs.PassCompleted(w, t, pass)
	}
}

// targetConfig converts a configured target for the client; url is the
// emulator's when the target is emulated.
func targetConfig(t *config.Target, url string) openai.TargetConfig {
	return openai.TargetConfig{
		Name:             t.Name,
		URL:              url,
		Model:            t.Model,
		API:              t.API,
		Dialect:          t.Dialect,
		PromptFormat:     t.PromptFormat,
		RequestTimeout:   time.Duration(t.RequestTimeout),
		HTTPClientConfig: *t.HTTPClientConfig,
		ExtraBody:        t.ExtraBody,
		SessionHeader:    t.SessionHeader,
	}
}
