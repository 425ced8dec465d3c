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

// Tokenize returns the ids the server at baseURL (without /v1) makes of
// text, without special tokens where the engine allows leaving them out.
// Its error wraps ErrNoEndpoint for a dialect without an endpoint.
func Tokenize(ctx context.Context, c *http.Client, baseURL string, d replay.Dialect, model, text string) ([]int, error) {
	ep, ok := endpointFor(d)
	if !ok {
		return nil, fmt.Errorf("dialect %s: %w", d, ErrNoEndpoint)
	}
	body, err := json.Marshal(ep.body(model, text))
	if err != nil {
		return nil, err
	}
	url := strings.TrimSuffix(baseURL, "/") + ep.path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	b, err := replay.ReadAnswer(c, req, maxBody)
	if err != nil {
		return nil, err
	}
	ids, err := ParseTokens(b)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", req.URL.Redacted(), err)
	}
	return ids, nil
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
