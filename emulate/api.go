package emulate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kvload-exporter/kvload-exporter/prompt"
)

// Request bodies. Unknown fields are ignored, as vLLM does; fields the
// emulator does not model (temperature, ignore_eos, min_tokens, ...) are
// accepted and have no effect, since output length is always max_tokens.

type streamOptions struct {
	// IncludeUsage defaults to true once stream_options is sent (vLLM).
	IncludeUsage *bool `json:"include_usage"`
}

type chatRequest struct {
	Model               string               `json:"model"`
	Messages            []prompt.ChatMessage `json:"messages"`
	Stream              bool                 `json:"stream"`
	StreamOptions       *streamOptions       `json:"stream_options"`
	MaxTokens           *int                 `json:"max_tokens"`
	MaxCompletionTokens *int                 `json:"max_completion_tokens"`
	N                   *int                 `json:"n"`
	CacheSalt           string               `json:"cache_salt"`
	AddGenerationPrompt *bool                `json:"add_generation_prompt"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int            `json:"max_tokens"`
	N             *int            `json:"n"`
	CacheSalt     string          `json:"cache_salt"`
}

type tokenizeRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	// Content is llama.cpp's form of the prompt (a string).
	Content json.RawMessage `json:"content"`
	// AddSpecialTokens (vLLM, SGLang; default true) and AddSpecial
	// (llama.cpp; default false) say whether the BOS is added.
	AddSpecialTokens    *bool                `json:"add_special_tokens"`
	AddSpecial          *bool                `json:"add_special"`
	Messages            []prompt.ChatMessage `json:"messages"`
	AddGenerationPrompt *bool                `json:"add_generation_prompt"`
	ReturnTokenStrs     bool                 `json:"return_token_strs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int    `json:"tokens"`
	TokenStrs   []string `json:"token_strs,omitempty"`
}

type detokenizeRequest struct {
	Model  string `json:"model"`
	Tokens []int  `json:"tokens"`
}

// Response bodies, shaped like vLLM's.

type usageJSON struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usageJSON        `json:"usage,omitempty"`
	Timings *timingsJSON      `json:"timings,omitempty"`
}

// timingsJSON is llama.cpp's timings object (llamacpp personality only).
type timingsJSON struct {
	CacheN              int     `json:"cache_n"`
	PromptN             int     `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

// textCompletion is both a /v1/completions chunk and its whole response:
// vLLM uses object "text_completion" for both.
type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usageJSON   `json:"usage,omitempty"`
	Timings *timingsJSON `json:"timings,omitempty"`
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason *string        `json:"finish_reason"`
	StopReason   *string        `json:"stop_reason"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usageJSON   `json:"usage"`
	Timings *timingsJSON `json:"timings,omitempty"`
}

// apiError is an error answered with vLLM's nested error body (since
// vLLM 0.10.1): {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	typ     string
	message string
	param   string
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", message: fmt.Sprintf(format, args...), param: param}
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeError(w http.ResponseWriter, e *apiError) {
	body := struct {
		Error errorInfo `json:"error"`
	}{errorInfo{Message: e.message, Type: e.typ, Code: e.status}}
	if e.param != "" {
		body.Error.Param = &e.param
	}
	writeJSON(w, e.status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own types get here; a failure is a bug.
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// readJSON decodes a bounded request body into v.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) *apiError {
	data, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	return decodeBody(data, v)
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apiError) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "RequestEntityTooLarge",
				message: fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit)}
		}
		return nil, badRequest("", "reading request body: %v", err)
	}
	return data, nil
}

// decodeBody decodes a JSON request body into v.
func decodeBody(data []byte, v any) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("", "empty request body")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return badRequest("", "invalid JSON body: %v", err)
	}
	return nil
}

// tokenizing takes one of the engine's tokenization slots, for the time
// a request's body is decoded, rendered and tokenized, and returns its
// release: a request waiting for one holds only its body's bytes.
func (e *Engine) tokenizing() (release func()) {
	e.encoding <- struct{}{}
	return func() { <-e.encoding }
}

// parsePrompt reads a /v1/completions or /tokenize prompt: a string, a
// list of strings (the first is used), a list of token ids, or a list of
// such lists (the first is used). Token ids are taken as they are, with no
// tokenization, so clients that send ids control the cache keys exactly.
func (e *Engine) parsePrompt(raw json.RawMessage) ([]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt", "prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		return e.encodeText(s)
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		if len(items) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		first := bytes.TrimSpace(items[0])
		switch {
		case len(first) > 0 && first[0] == '"':
			var s string
			if err := json.Unmarshal(first, &s); err != nil {
				return nil, badRequest("prompt", "prompt[0]: %v", err)
			}
			return e.encodeText(s)
		case len(first) > 0 && first[0] == '[':
			return tokenIDs(first)
		default:
			return tokenIDs(raw)
		}
	}
	return nil, badRequest("prompt", "prompt must be a string, a list of strings, or a list of token ids")
}

// The BOS token of Config.BOS: o200k_base has none, so its end-of-text
// special token stands in, an id that plain text never encodes to.
const (
	bosToken = 199999
	bosText  = "<|endoftext|>"
)

// encodeText tokenizes a text prompt, with the BOS token first if
// configured (every text path goes through here, /tokenize included, so
// counts agree).
func (e *Engine) encodeText(s string) ([]int, *apiError) {
	ids, err := e.tok.Encode(s)
	if err != nil {
		return nil, badRequest("prompt", "%v", err)
	}
	if e.cfg.BOS {
		ids = append([]int{bosToken}, ids...)
	}
	return ids, nil
}

// tokenIDs decodes a JSON list of token ids, each within 24 bits like a
// real vocabulary's (the prefix cache keeps them in 3 bytes).
func tokenIDs(raw json.RawMessage) ([]int, *apiError) {
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, badRequest("prompt", "prompt: token ids must be integers: %v", err)
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		if id < 0 || id > maxToken {
			return nil, badRequest("prompt", "prompt: token id %d out of range", id)
		}
		out[i] = int(id)
	}
	return out, nil
}
