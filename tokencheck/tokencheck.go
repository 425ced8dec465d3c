// Package tokencheck asks a target's own tokenizer, through its tokenize
// endpoint, for the tokens of a prompt the exporter built. The exporter
// builds prompts of words it knows to be one token each in the common
// vocabularies; a server whose tokenizer splits them differently receives
// prompts of another length than the trace asks for, and this is where
// that shows, once, at start-up.
package tokencheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// ErrNoEndpoint means the dialect's engine has no tokenize endpoint.
var ErrNoEndpoint = errors.New("the engine has no tokenize endpoint")

// maxBody bounds what is read of one answer: a token list of a short
// prompt is a few kilobytes.
const maxBody = 4 << 20

// endpoint is one engine's tokenize route and the body it takes.
type endpoint struct {
	path string
	body func(model, text string) any
}

// The request bodies. Special tokens are left out where the engine lets a
// client say so: the check is of the text, and a BOS is the engine's.
type openAIBody struct {
	Model            string `json:"model,omitempty"`
	Prompt           string `json:"prompt"`
	AddSpecialTokens bool   `json:"add_special_tokens"`
}

type trtllmBody struct {
	Model  string `json:"model,omitempty"`
	Prompt string `json:"prompt"`
}

type llamaCppBody struct {
	Content    string `json:"content"`
	AddSpecial bool   `json:"add_special"`
}

func endpointFor(d replay.Dialect) (endpoint, bool) {
	switch d {
	case replay.DialectVLLM, replay.DialectDynamo:
		return endpoint{"/tokenize", func(m, t string) any { return openAIBody{Model: m, Prompt: t} }}, true
	case replay.DialectSGLang:
		return endpoint{"/v1/tokenize", func(m, t string) any { return openAIBody{Model: m, Prompt: t} }}, true
	case replay.DialectTRTLLM:
		// No flag for special tokens: a BOS may be counted.
		return endpoint{"/_internal/tokenize", func(m, t string) any { return trtllmBody{Model: m, Prompt: t} }}, true
	case replay.DialectLlamaCpp:
		return endpoint{"/tokenize", func(_, t string) any { return llamaCppBody{Content: t} }}, true
	}
	return endpoint{}, false
}

// Has tells whether Tokenize can ask a dialect's engine.
func Has(d replay.Dialect) bool {
	_, ok := endpointFor(d)
	return ok
}

// chatMessage is one message of a chat tokenize request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// vllmChatBody is vLLM's chat form of /tokenize: the messages rendered by
// the server's chat template with the assistant's header, special tokens
// as the template writes them (vLLM's chat default), which is what
// /v1/chat/completions counts.
type vllmChatBody struct {
	Model               string        `json:"model,omitempty"`
	Messages            []chatMessage `json:"messages"`
	AddGenerationPrompt bool          `json:"add_generation_prompt"`
}

// llamaCppTemplateBody asks llama.cpp's /apply-template for the text its
// chat endpoint would tokenize.
type llamaCppTemplateBody struct {
	Messages []chatMessage `json:"messages"`
}

// llamaCppTokenizeTemplated tokenizes a rendered chat as llama.cpp's chat
// endpoint does: special tokens added where the model asks for them, and
// special-token text in the template read as special tokens.
type llamaCppTokenizeTemplated struct {
	Content      string `json:"content"`
	AddSpecial   bool   `json:"add_special"`
	ParseSpecial bool   `json:"parse_special"`
}

// HasChat tells whether TokenizeChat can ask a dialect's engine: vLLM's
// /tokenize takes messages, llama.cpp renders them with /apply-template.
// SGLang's, TensorRT-LLM's and Dynamo's tokenize routes take a prompt only.
func HasChat(d replay.Dialect) bool {
	return d == replay.DialectVLLM || d == replay.DialectLlamaCpp
}

// TokenizeChat returns the ids the server at baseURL makes of a chat of one
// user message, text, as its chat completions endpoint counts them: the
// chat template included. Its error wraps ErrNoEndpoint for a dialect
// HasChat refuses.
func TokenizeChat(ctx context.Context, c *http.Client, baseURL string, d replay.Dialect, model, text string) ([]int, error) {
	msgs := []chatMessage{{Role: "user", Content: text}}
	switch d {
	case replay.DialectVLLM:
		b, where, err := post(ctx, c, baseURL, "/tokenize", vllmChatBody{Model: model, Messages: msgs, AddGenerationPrompt: true})
		if err != nil {
			return nil, err
		}
		return parseAt(b, where)
	case replay.DialectLlamaCpp:
		b, where, err := post(ctx, c, baseURL, "/apply-template", llamaCppTemplateBody{Messages: msgs})
		if err != nil {
			return nil, err
		}
		var rendered struct {
			Prompt *string `json:"prompt"`
		}
		if err := json.Unmarshal(b, &rendered); err != nil || rendered.Prompt == nil {
			return nil, fmt.Errorf("%s: the answer has no prompt string: %.60q", where, b)
		}
		b, where, err = post(ctx, c, baseURL, "/tokenize", llamaCppTokenizeTemplated{Content: *rendered.Prompt, AddSpecial: true, ParseSpecial: true})
		if err != nil {
			return nil, err
		}
		return parseAt(b, where)
	}
	return nil, fmt.Errorf("dialect %s: chat: %w", d, ErrNoEndpoint)
}

// post sends body as JSON to baseURL+path and returns the answer's body
// and the route, credentials redacted, for errors about the answer.
func post(ctx context.Context, c *http.Client, baseURL, path string, body any) ([]byte, string, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	where := "POST " + req.URL.Redacted()
	b, err = replay.ReadAnswer(c, req, maxBody)
	return b, where, err
}

// parseAt is ParseTokens with the route in its error.
func parseAt(b []byte, where string) ([]int, error) {
	ids, err := ParseTokens(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return ids, nil
}

// Tokenize returns the ids the server at baseURL (without /v1) makes of
// text, without special tokens where the engine allows leaving them out.
// Its error wraps ErrNoEndpoint for a dialect without an endpoint.
func Tokenize(ctx context.Context, c *http.Client, baseURL string, d replay.Dialect, model, text string) ([]int, error) {
	ep, ok := endpointFor(d)
	if !ok {
		return nil, fmt.Errorf("dialect %s: %w", d, ErrNoEndpoint)
	}
	b, where, err := post(ctx, c, baseURL, ep.path, ep.body(model, text))
	if err != nil {
		return nil, err
	}
	return parseAt(b, where)
}

// ParseTokens reads a tokenize answer: an object whose "tokens" is a list
// of ids (vLLM, SGLang, Dynamo, TensorRT-LLM, llama.cpp) or of {id, piece}
// (llama.cpp with_pieces), with an optional "count" that must agree.
func ParseTokens(b []byte) ([]int, error) {
	var ans struct {
		Tokens []json.RawMessage `json:"tokens"`
		Count  *int              `json:"count"`
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, fmt.Errorf("tokenize answer is not a JSON object with tokens: %w", err)
	}
	if ans.Tokens == nil {
		return nil, errors.New("tokenize answer has no tokens list")
	}
	ids := make([]int, len(ans.Tokens))
	for i, raw := range ans.Tokens {
		if err := json.Unmarshal(raw, &ids[i]); err == nil {
			continue
		}
		var piece struct {
			ID *int `json:"id"`
		}
		if err := json.Unmarshal(raw, &piece); err != nil || piece.ID == nil {
			return nil, fmt.Errorf("tokenize answer: token %d is %.40s, neither an id nor {id, piece}", i, raw)
		}
		ids[i] = *piece.ID
	}
	if ans.Count != nil && *ans.Count != len(ids) {
		return nil, fmt.Errorf("tokenize answer: count %d but %d tokens", *ans.Count, len(ids))
	}
	return ids, nil
}
