package emulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultMaxTokens is vLLM's /v1/completions default. vLLM's chat
// endpoint would generate up to the context length instead; the emulator
// uses 16 for both, since a runaway default helps no one here.
const defaultMaxTokens = 16

// shutdownGrace bounds how long Serve waits for handlers after its
// context ends; they all watch the context, so it is rarely reached.
const shutdownGrace = 5 * time.Second

func (e *Engine) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.handleChat)
	mux.HandleFunc("POST /v1/completions", e.handleCompletion)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("POST /tokenize", e.handleTokenize)
	mux.HandleFunc("POST /detokenize", e.handleDetokenize)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /emulator/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, e.Stats()) })
	mux.HandleFunc("POST /emulator/cache", e.handleCacheControl)
	mux.HandleFunc("GET /emulator/faults", e.handleGetFaults)
	mux.HandleFunc("POST /emulator/faults", e.handleSetFaults)
	// Each engine's own way of telling its cache capacity.
	switch e.cfg.Engine {
	case PersonalitySGLang:
		if !e.cfg.HideCacheConfig {
			mux.HandleFunc("GET /get_server_info", e.handleServerInfo)
		}
	case PersonalityLlamaCpp:
		mux.HandleFunc("GET /props", e.handleProps)
	}
	return mux
}

// generation is a validated generation request.
type generation struct {
	chat         bool
	tokens       []int
	stream       bool
	includeUsage bool
	maxTokens    int
	salt         string
}

func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) {
	arrival := e.now()
	e.received()
	body, err := readBody(w, r, e.cfg.MaxBodyBytes)
	if err != nil {
		e.reject(w, err)
		return
	}
	g, err := e.chatBody(body)
	if err != nil {
		e.reject(w, err)
		return
	}
	e.generate(w, r, g, arrival)
}

// chatBody turns a chat request's body into a generation, in a
// tokenization slot.
func (e *Engine) chatBody(body []byte) (generation, *apiError) {
	defer e.tokenizing()()
	var req chatRequest
	if err := decodeBody(body, &req); err != nil {
		return generation{}, err
	}
	return e.chatGeneration(&req)
}

func (e *Engine) chatGeneration(req *chatRequest) (generation, *apiError) {
	if err := e.checkCommon(req.Model, req.Stream, req.StreamOptions, req.N); err != nil {
		return generation{}, err
	}
	if len(req.Messages) == 0 {
		return generation{}, badRequest("messages", "messages must not be empty")
	}
	text, err := renderChat(req.Messages, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
	if err != nil {
		return generation{}, badRequest("messages", "%v", err)
	}
	tokens, apiErr := e.encodeText(text)
	if apiErr != nil {
		return generation{}, apiErr
	}
	// max_completion_tokens replaces the deprecated max_tokens and wins.
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	salt, apiErr := e.cacheSalt(true, req.CacheSalt)
	if apiErr != nil {
		return generation{}, apiErr
	}
	return e.finishGeneration(true, tokens, req.Stream, req.StreamOptions, maxTokens, salt)
}

// cacheSalt is the salt a request's cache_salt puts its prompt under, as
// the personality treats it on chat or completions.
func (e *Engine) cacheSalt(chat bool, salt string) (string, *apiError) {
	switch e.cfg.Engine.cacheSalt(chat) {
	case saltIgnored:
		return "", nil
	case saltRefused:
		if salt != "" {
			return "", badRequest("cache_salt", "extra inputs are not permitted")
		}
	}
	return salt, nil
}

func (e *Engine) handleCompletion(w http.ResponseWriter, r *http.Request) {
	arrival := e.now()
	e.received()
	body, err := readBody(w, r, e.cfg.MaxBodyBytes)
	if err != nil {
		e.reject(w, err)
		return
	}
	g, err := e.completionBody(body)
	if err != nil {
		e.reject(w, err)
		return
	}
	e.generate(w, r, g, arrival)
}

// completionBody turns a completion request's body into a generation, in
// a tokenization slot.
func (e *Engine) completionBody(body []byte) (generation, *apiError) {
	defer e.tokenizing()()
	var req completionRequest
	if err := decodeBody(body, &req); err != nil {
		return generation{}, err
	}
	if err := e.checkCommon(req.Model, req.Stream, req.StreamOptions, req.N); err != nil {
		return generation{}, err
	}
	tokens, err := e.parsePrompt(req.Prompt)
	if err != nil {
		return generation{}, err
	}
	salt, err := e.cacheSalt(false, req.CacheSalt)
	if err != nil {
		return generation{}, err
	}
	return e.finishGeneration(false, tokens, req.Stream, req.StreamOptions, req.MaxTokens, salt)
}

// checkCommon validates what chat and completion requests share.
func (e *Engine) checkCommon(model string, stream bool, opts *streamOptions, n *int) *apiError {
	if model != "" && model != e.cfg.Model {
		return &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
			message: fmt.Sprintf("model %q is not served here; this emulator serves %q", model, e.cfg.Model)}
	}
	if opts != nil && !stream {
		return badRequest("stream_options", "stream_options is only allowed when stream is true")
	}
	if n != nil && *n != 1 {
		return badRequest("n", "the emulator generates one choice per request, got n=%d", *n)
	}
	return nil
}

func (e *Engine) finishGeneration(chat bool, tokens []int, stream bool, opts *streamOptions, maxTokens *int, salt string) (generation, *apiError) {
	if len(tokens) == 0 {
		return generation{}, badRequest("prompt", "the prompt must not be empty")
	}
	g := generation{chat: chat, tokens: tokens, stream: stream, maxTokens: defaultMaxTokens, salt: salt}
	if maxTokens != nil {
		g.maxTokens = *maxTokens
	}
	if g.maxTokens < 1 {
		return generation{}, badRequest("max_tokens", "max_tokens must be at least 1, got %d", g.maxTokens)
	}
	if total := len(tokens) + g.maxTokens; total > e.cfg.MaxModelLen {
		return generation{}, badRequest("max_tokens",
			"the context window holds %d tokens, but %d prompt tokens plus %d output tokens make %d",
			e.cfg.MaxModelLen, len(tokens), g.maxTokens, total)
	}
	g.includeUsage = opts != nil && (opts.IncludeUsage == nil || *opts.IncludeUsage)
	return g, nil
}

func (e *Engine) reject(w http.ResponseWriter, err *apiError) {
	e.finish(ResultRejected, usageCounts{})
	writeError(w, err)
}

// generate runs an admitted request through the fault draw, the queue,
// the prefix cache and the timing model, and writes the response.
func (e *Engine) generate(w http.ResponseWriter, r *http.Request, g generation, arrival time.Time) {
	ctx := r.Context()
	p := e.faults.draw()
	switch p.kind {
	case fault500:
		e.finish(ResultError500, usageCounts{})
		writeError(w, &apiError{status: http.StatusInternalServerError, typ: "InternalServerError",
			message: "injected fault: internal server error"})
		return
	case fault429:
		e.finish(ResultError429, usageCounts{})
		w.Header().Set("Retry-After", "1")
		writeError(w, &apiError{status: http.StatusTooManyRequests, typ: "RateLimitError",
			message: "injected fault: too many requests"})
		return
	case faultHang:
		hang(ctx, w, g.stream)
		e.finish(ResultHung, usageCounts{})
		return
	}

	// Like vLLM (whose streaming response starts before the engine
	// schedules the request), headers go out before queueing.
	var sse *sseWriter
	if g.stream {
		sse = newSSEWriter(w)
		if err := sse.start(); err != nil {
			e.finish(ResultCanceled, usageCounts{})
			return
		}
	}
	if err := e.sched.acquire(ctx); err != nil {
		e.finish(ResultCanceled, usageCounts{})
		return
	}
	// The slot is freed just before the request is counted, so that a
	// client which has read its whole response sees it neither running
	// nor unaccounted.
	release := sync.OnceFunc(e.sched.release)
	defer release()
	end := func(r Result, u usageCounts) {
		release()
		e.finish(r, u)
	}

	n := len(g.tokens)
	hit, cl := e.cache.lookup(g.salt, g.tokens)
	e.admitted(n, hit)
	prefill := e.cfg.Overhead + time.Duration(n-hit)*e.cfg.PrefillPerToken
	if p.slow {
		e.slowed()
		prefill += p.faults.SlowFirstTokenDelay
	}
	if err := e.sleep(ctx, prefill); err != nil {
		e.cache.release(cl)
		end(ResultCanceled, usageCounts{})
		return
	}
	// A request's blocks become reusable once its prefill is done.
	e.cache.insert(cl)

	rn := &run{e: e, g: g, usage: usageCounts{prompt: n, completion: g.maxTokens, cached: hit},
		arrival: arrival, prefill: prefill, cut: p.cutAt(g.maxTokens), fault: p.kind, end: end}
	if g.stream {
		prefix := "cmpl-"
		if g.chat {
			prefix = "chatcmpl-"
		}
		rn.id = e.newID(prefix)
		rn.stream(ctx, sse)
		return
	}
	rn.respond(ctx, w)
}

// run is one admitted request past its prefill.
type run struct {
	e       *Engine
	g       generation
	id      string
	usage   usageCounts
	arrival time.Time
	prefill time.Duration // the modelled prefill, for llama.cpp's timings
	cut     int           // tokens before a disconnect or malformed fault; -1 for none
	fault   faultKind
	end     func(Result, usageCounts) // frees the slot, then counts
}

func (e *Engine) newID(prefix string) string {
	return prefix + "emu-" + strconv.FormatUint(e.nextID.Add(1), 16)
}

// sleepUntil keeps the decode pace anchored to the first token, so
// per-token overheads do not accumulate into drift.
func (rn *run) sleepUntil(ctx context.Context, t time.Time) error {
	return rn.e.sleep(ctx, t.Sub(rn.e.now()))
}

// stream writes the SSE response: for chat a role-only chunk, then one
// chunk per token, the last with finish_reason "length", then the usage
// chunk if asked for, then [DONE].
func (rn *run) stream(ctx context.Context, sse *sseWriter) {
	e, g := rn.e, rn.g
	created := rn.arrival.Unix()
	if g.chat {
		empty := ""
		if err := sse.event(chatChunk{ID: rn.id, Object: "chat.completion.chunk", Created: created, Model: e.cfg.Model,
			Choices: []chatChunkChoice{{Delta: chatDelta{Role: "assistant", Content: &empty}}}}); err != nil {
			rn.end(ResultCanceled, usageCounts{})
			return
		}
	}
	var first time.Time
	// gone: the client left while HoldAbandonedSlots keeps generating
	// into the void, its slot held, until the output would have ended.
	gone := false
	decodeCtx := ctx
	if e.cfg.HoldAbandonedSlots {
		decodeCtx = context.WithoutCancel(ctx)
	}
	for i := range g.maxTokens {
		if i == rn.cut && !gone {
			rn.breakStream(sse)
			return
		}
		if ctx.Err() != nil {
			if !e.cfg.HoldAbandonedSlots {
				rn.end(ResultCanceled, usageCounts{})
				return
			}
			gone = true
		}
		if i > 0 && e.cfg.InterToken > 0 {
			if err := rn.sleepUntil(decodeCtx, first.Add(time.Duration(i)*e.cfg.InterToken)); err != nil {
				rn.end(ResultCanceled, usageCounts{})
				return
			}
		}
		if i == 0 {
			first = e.now()
			e.m.ttft.Observe(first.Sub(rn.arrival).Seconds())
		}
		e.m.genTokens.Inc()
		if gone {
			continue
		}
		if err := sse.event(rn.tokenChunk(i, first, created)); err != nil {
			if !e.cfg.HoldAbandonedSlots {
				rn.end(ResultCanceled, usageCounts{})
				return
			}
			gone = true
		}
	}
	if gone {
		rn.end(ResultCanceled, usageCounts{})
		return
	}
	if rn.cut == g.maxTokens {
		rn.breakStream(sse)
		return
	}
	if g.includeUsage {
		u, tm := rn.usageJSON(), rn.timings(first)
		var err error
		if g.chat {
			err = sse.event(chatChunk{ID: rn.id, Object: "chat.completion.chunk", Created: created, Model: e.cfg.Model,
				Choices: []chatChunkChoice{}, Usage: u, Timings: tm})
		} else {
			err = sse.event(textCompletion{ID: rn.id, Object: "text_completion", Created: created, Model: e.cfg.Model,
				Choices: []textChoice{}, Usage: u, Timings: tm})
		}
		if err != nil {
			rn.end(ResultCanceled, usageCounts{})
			return
		}
	}
	rn.end(ResultSuccess, rn.usage)
	_ = sse.raw("data: [DONE]\n\n")
}

// tokenChunk is the stream's chunk of output token i; the last carries
// finish_reason "length" (and llama.cpp's timings when no usage follows).
func (rn *run) tokenChunk(i int, first time.Time, created int64) any {
	e, g := rn.e, rn.g
	var finish *string
	var timings *timingsJSON
	if i == g.maxTokens-1 {
		finish = ptr("length")
		if !g.includeUsage {
			timings = rn.timings(first)
		}
	}
	piece := e.pieces[i%len(e.pieces)]
	if g.chat {
		return chatChunk{ID: rn.id, Object: "chat.completion.chunk", Created: created, Model: e.cfg.Model,
			Choices: []chatChunkChoice{{Delta: chatDelta{Content: &piece}, FinishReason: finish}}, Timings: timings}
	}
	return textCompletion{ID: rn.id, Object: "text_completion", Created: created, Model: e.cfg.Model,
		Choices: []textChoice{{Text: piece, FinishReason: finish}}, Timings: timings}
}

// breakStream enacts a disconnect or malformed fault mid-stream.
func (rn *run) breakStream(sse *sseWriter) {
	if rn.fault == faultDisconnect {
		rn.end(ResultDisconnected, usageCounts{})
		disconnect(sse.w)
		return
	}
	rn.end(ResultMalformed, usageCounts{})
	_ = sse.raw("data: {not json\n\n")
}

// respond writes a non-streaming response once the whole output would
// have been generated.
func (rn *run) respond(ctx context.Context, w http.ResponseWriter) {
	e, g := rn.e, rn.g
	first := e.now()
	e.m.ttft.Observe(first.Sub(rn.arrival).Seconds())
	if g.maxTokens > 1 && e.cfg.InterToken > 0 {
		if err := rn.sleepUntil(ctx, first.Add(time.Duration(g.maxTokens-1)*e.cfg.InterToken)); err != nil {
			rn.end(ResultCanceled, usageCounts{})
			return
		}
	}
	switch rn.fault {
	case faultDisconnect:
		e.m.genTokens.Add(float64(rn.cut))
		rn.end(ResultDisconnected, usageCounts{})
		disconnect(w)
		return
	case faultMalformed:
		e.m.genTokens.Add(float64(rn.cut))
		rn.end(ResultMalformed, usageCounts{})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("{not json"))
		return
	}
	text := make([]byte, 0, 8*g.maxTokens)
	for i := range g.maxTokens {
		text = append(text, e.pieces[i%len(e.pieces)]...)
	}
	e.m.genTokens.Add(float64(g.maxTokens))
	created := rn.arrival.Unix()
	var body any
	tm := rn.timings(first)
	if g.chat {
		body = chatCompletion{ID: e.newID("chatcmpl-"), Object: "chat.completion", Created: created, Model: e.cfg.Model,
			Choices: []chatChoice{{Message: chatMessageOut{Role: "assistant", Content: string(text)}, FinishReason: ptr("length")}},
			Usage:   rn.usageJSON(), Timings: tm}
	} else {
		body = textCompletion{ID: e.newID("cmpl-"), Object: "text_completion", Created: created, Model: e.cfg.Model,
			Choices: []textChoice{{Text: string(text), FinishReason: ptr("length")}}, Usage: rn.usageJSON(), Timings: tm}
	}
	rn.end(ResultSuccess, rn.usage)
	writeJSON(w, http.StatusOK, body)
}

func (rn *run) usageJSON() *usageJSON {
	u := &usageJSON{PromptTokens: rn.usage.prompt, CompletionTokens: rn.usage.completion,
		TotalTokens: rn.usage.prompt + rn.usage.completion}
	if !rn.e.cfg.OmitCachedTokens {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: rn.usage.cached}
	}
	return u
}

// timings is llama.cpp's timings object, which its server attaches to a
// response's last chunk (tools/server result_timings::to_json): cache_n is
// the prompt tokens reused from the slot, prompt_n those evaluated. Only
// the llamacpp personality sends it.
func (rn *run) timings(first time.Time) *timingsJSON {
	if rn.e.cfg.Engine != PersonalityLlamaCpp {
		return nil
	}
	u := rn.usage
	t := &timingsJSON{CacheN: u.cached, PromptN: u.prompt - u.cached, PromptMS: ms(rn.prefill),
		PredictedN: u.completion, PredictedMS: ms(rn.e.now().Sub(first))}
	t.PromptPerTokenMS, t.PromptPerSecond = rates(t.PromptN, t.PromptMS)
	t.PredictedPerTokenMS, t.PredictedPerSecond = rates(t.PredictedN, t.PredictedMS)
	return t
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rates returns milliseconds per token and tokens per second, 0 where
// undefined (a zero-time prefill in tests).
func rates(n int, msTotal float64) (perToken, perSecond float64) {
	if n > 0 {
		perToken = msTotal / float64(n)
	}
	if msTotal > 0 {
		perSecond = 1e3 * float64(n) / msTotal
	}
	return perToken, perSecond
}

func ptr[T any](v T) *T { return &v }

// sseWriter writes server-sent events, flushing each one so that the
// client's timings see tokens when they are produced.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func setSSEHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
}

func (s *sseWriter) start() error {
	setSSEHeaders(s.w)
	s.w.WriteHeader(http.StatusOK)
	return s.rc.Flush()
}

func (s *sseWriter) event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("sse: %w", err)
	}
	s.buf = append(append(append(s.buf[:0], "data: "...), b...), "\n\n"...)
	return s.write(s.buf)
}

func (s *sseWriter) raw(line string) error { return s.write([]byte(line)) }

func (s *sseWriter) write(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("sse: %w", err)
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("sse: %w", err)
	}
	return nil
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Root        string `json:"root"`
		MaxModelLen int    `json:"max_model_len"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: e.cfg.Model, Object: "model", Created: e.now().Unix(), OwnedBy: "kvload-exporter",
		Root: e.cfg.Model, MaxModelLen: e.cfg.MaxModelLen}}})
}

// handleTokenize counts tokens exactly as the generation endpoints do, so
// a client can calibrate: the chat form renders the same template.
func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, e.cfg.MaxBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	resp, err := e.tokenizeBody(body)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// tokenizeBody answers a tokenize request's body, in a tokenization slot.
func (e *Engine) tokenizeBody(body []byte) (tokenizeResponse, *apiError) {
	defer e.tokenizing()()
	var req tokenizeRequest
	if err := decodeBody(body, &req); err != nil {
		return tokenizeResponse{}, err
	}
	if req.Model != "" && req.Model != e.cfg.Model {
		return tokenizeResponse{}, &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
			message: fmt.Sprintf("model %q is not served here; this emulator serves %q", req.Model, e.cfg.Model)}
	}
	var tokens []int
	if req.Messages != nil {
		text, err := renderChat(req.Messages, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
		if err != nil {
			return tokenizeResponse{}, badRequest("messages", "%v", err)
		}
		var apiErr *apiError
		if tokens, apiErr = e.encodeText(text); apiErr != nil {
			return tokenizeResponse{}, apiErr
		}
	} else {
		prompt, special := req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens
		if req.Prompt == nil && req.Content != nil {
			prompt, special = req.Content, req.AddSpecial != nil && *req.AddSpecial
		}
		var apiErr *apiError
		if tokens, apiErr = e.parsePrompt(prompt); apiErr != nil {
			return tokenizeResponse{}, apiErr
		}
		// Text without special tokens: the BOS encodeText added goes.
		if !special && e.cfg.BOS && len(tokens) > 0 && tokens[0] == bosToken && isTextPrompt(prompt) {
			tokens = tokens[1:]
		}
	}
	resp := tokenizeResponse{Count: len(tokens), MaxModelLen: e.cfg.MaxModelLen, Tokens: tokens}
	if req.ReturnTokenStrs {
		strs, err := pieces(e.tok, tokens)
		if err != nil {
			return tokenizeResponse{}, badRequest("prompt", "%v", err)
		}
		resp.TokenStrs = strs
	}
	return resp, nil
}

// isTextPrompt tells a text prompt (a string or strings) from token ids.
func isTextPrompt(raw json.RawMessage) bool {
	return json.Unmarshal(raw, new(string)) == nil || json.Unmarshal(raw, new([]string)) == nil
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if err := readJSON(w, r, e.cfg.MaxBodyBytes, &req); err != nil {
		writeError(w, err)
		return
	}
	text, err := decode(e.tok, req.Tokens)
	if err != nil {
		writeError(w, badRequest("tokens", "%v", err))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Prompt string `json:"prompt"`
	}{text})
}

// handleCacheControl applies {"enabled": bool, "capacity_blocks": n,
// "cache_ram_tokens": n, "flush": true} in that order (each optional) and
// answers the cache state. cache_ram_tokens is llamacpp's host prompt
// cache, 0 turning it off. With "redeploy": true the capacity is that of a
// redeployed engine (Redeploy): told, and the cache empty.
func (e *Engine) handleCacheControl(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Enabled        *bool `json:"enabled"`
		CapacityBlocks *int  `json:"capacity_blocks"`
		CacheRAMTokens *int  `json:"cache_ram_tokens"`
		Redeploy       bool  `json:"redeploy"`
		Flush          bool  `json:"flush"`
	}
	if err := readJSON(w, r, 1<<20, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := e.checkCacheControl(req.CapacityBlocks, req.CacheRAMTokens); err != nil {
		writeError(w, err)
		return
	}
	if req.Redeploy && req.CapacityBlocks == nil {
		writeError(w, badRequest("redeploy", "redeploy needs capacity_blocks"))
		return
	}
	if req.Enabled != nil {
		e.SetCacheEnabled(*req.Enabled)
	}
	switch {
	case req.Redeploy:
		_ = e.Redeploy(*req.CapacityBlocks) // checked above
	case req.CapacityBlocks != nil:
		_ = e.Resize(*req.CapacityBlocks) // checked above
	}
	if req.CacheRAMTokens != nil {
		_ = e.SetCacheRAMTokens(*req.CacheRAMTokens) // checked above
	}
	if req.Flush {
		e.Flush()
	}
	writeJSON(w, http.StatusOK, e.cache.state())
}

// checkCacheControl refuses a cache change before any is applied.
func (e *Engine) checkCacheControl(capacityBlocks, cacheRAMTokens *int) *apiError {
	llama := e.cfg.Engine == PersonalityLlamaCpp
	switch {
	case capacityBlocks != nil && *capacityBlocks < 0:
		return badRequest("capacity_blocks", "capacity_blocks must not be negative, got %d", *capacityBlocks)
	case capacityBlocks != nil && *capacityBlocks == 0 && llama:
		return badRequest("capacity_blocks", "capacity_blocks is the number of slots for engine llamacpp and must be at least 1")
	case cacheRAMTokens != nil && !llama:
		return badRequest("cache_ram_tokens", "cache_ram_tokens is llamacpp's host prompt cache; engine %s has none", e.cfg.Engine)
	case cacheRAMTokens != nil && *cacheRAMTokens < 0:
		return badRequest("cache_ram_tokens", "cache_ram_tokens must not be negative (0 turns the host prompt cache off), got %d", *cacheRAMTokens)
	}
	return nil
}

// faultsJSON is Faults on the wire, with the delay as a Go duration string.
type faultsJSON struct {
	Error500            float64 `json:"error_500"`
	Error429            float64 `json:"error_429"`
	Disconnect          float64 `json:"disconnect"`
	Malformed           float64 `json:"malformed"`
	Hang                float64 `json:"hang"`
	SlowFirstToken      float64 `json:"slow_first_token"`
	SlowFirstTokenDelay string  `json:"slow_first_token_delay,omitempty"`
	AfterTokens         int     `json:"after_tokens"`
}

func (e *Engine) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	f := e.faults.get()
	writeJSON(w, http.StatusOK, faultsJSON{Error500: f.Error500, Error429: f.Error429, Disconnect: f.Disconnect,
		Malformed: f.Malformed, Hang: f.Hang, SlowFirstToken: f.SlowFirstToken,
		SlowFirstTokenDelay: f.SlowFirstTokenDelay.String(), AfterTokens: f.AfterTokens})
}

// handleSetFaults replaces all fault settings; absent fields are zero.
func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var req faultsJSON
	if err := readJSON(w, r, 1<<20, &req); err != nil {
		writeError(w, err)
		return
	}
	f := Faults{Error500: req.Error500, Error429: req.Error429, Disconnect: req.Disconnect, Malformed: req.Malformed,
		Hang: req.Hang, SlowFirstToken: req.SlowFirstToken, AfterTokens: req.AfterTokens}
	if req.SlowFirstTokenDelay != "" {
		d, err := time.ParseDuration(req.SlowFirstTokenDelay)
		if err != nil {
			writeError(w, badRequest("slow_first_token_delay", "%v", err))
			return
		}
		f.SlowFirstTokenDelay = d
	}
	if err := e.SetFaults(f); err != nil {
		writeError(w, badRequest("", "%v", err))
		return
	}
	e.handleGetFaults(w, r)
}

// Serve answers on l until ctx ends, then shuts down: every request
// context derives from ctx, so streams and hung requests end with it, and
// Serve returns once their handlers have.
func (e *Engine) Serve(ctx context.Context, l net.Listener) error {
	if e.events != nil {
		if err := e.BindKVEvents(); err != nil {
			_ = l.Close()
			return err
		}
		published := make(chan struct{})
		pctx, stop := context.WithCancel(ctx)
		go func() {
			defer close(published)
			e.events.serve(pctx)
		}()
		defer func() {
			stop()
			<-published
		}()
	}
	srv := &http.Server{
		Handler:           e.mux,
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("emulate: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("emulate: shutdown: %w", err)
	}
	return nil
}

// Start listens on addr (host:port; port 0 picks one) and serves in the
// background until ctx ends. It returns the base URL (http://host:port)
// and a wait function that blocks until the server has shut down and
// returns Serve's error; wait may be called more than once.
func (e *Engine) Start(ctx context.Context, addr string) (baseURL string, wait func() error, err error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("emulate: %w", err)
	}
	// The events endpoint is bound before Start returns, so that
	// KVEventsEndpoint names it and a bad one fails here.
	if err := e.BindKVEvents(); err != nil {
		_ = l.Close()
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, l) }()
	return "http://" + l.Addr().String(), sync.OnceValue(func() error { return <-done }), nil
}
