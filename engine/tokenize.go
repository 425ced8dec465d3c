package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ErrNoEndpoint means the engine has no tokenize endpoint of the kind
// asked for.
var ErrNoEndpoint = errors.New("the engine has no tokenize endpoint")

// maxTokenizeBody bounds what is read of one tokenize answer: a token list
// of a short prompt is a few kilobytes.
const maxTokenizeBody = 4 << 20

// tokenizeRoute is one engine's tokenize route and the body it takes.
type tokenizeRoute struct {
	path string
	body func(model, text string) any
}

// chatTokenizer tokenizes a chat as the engine's chat endpoint counts it.
type chatTokenizer func(ctx context.Context, c *http.Client, base, model string, msgs []chatMessage) ([]int, error)

// chatMessage is one message of a chat tokenize request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// openAITokenizeBody is the body of vLLM's, SGLang's and Dynamo's
// tokenize routes. Special tokens are left out: the check is of the text,
// and a BOS is the engine's.
func openAITokenizeBody(model, text string) any {
	return struct {
		Model            string `json:"model,omitempty"`
		Prompt           string `json:"prompt"`
		AddSpecialTokens bool   `json:"add_special_tokens"`
	}{Model: model, Prompt: text}
}

// CanTokenize tells whether Tokenize can ask the engine.
func (s *Spec) CanTokenize() bool { return s.tokenize != nil }

// CanTokenizeChat tells whether TokenizeChat can ask the engine: vLLM's
// /tokenize takes messages, llama.cpp renders them with /apply-template.
// SGLang's, TensorRT-LLM's and Dynamo's tokenize routes take a prompt only.
func (s *Spec) CanTokenizeChat() bool { return s.tokenizeChat != nil }

// Tokenize returns the ids the server at baseURL (without /v1) makes of
// text, without special tokens where the engine allows leaving them out.
// Its error wraps ErrNoEndpoint for an engine without an endpoint.
func (s *Spec) Tokenize(ctx context.Context, c *http.Client, baseURL, model, text string) ([]int, error) {
	if s.tokenize == nil {
		return nil, fmt.Errorf("dialect %s: %w", s.Dialect, ErrNoEndpoint)
	}
	b, where, err := post(ctx, c, baseURL, s.tokenize.path, s.tokenize.body(model, text))
	if err != nil {
		return nil, err
	}
	return parseAt(b, where)
}

// TokenizeChat returns the ids the server at baseURL makes of a chat of
// one user message, text, as its chat completions endpoint counts them:
// the chat template included. Its error wraps ErrNoEndpoint for an engine
// CanTokenizeChat refuses.
func (s *Spec) TokenizeChat(ctx context.Context, c *http.Client, baseURL, model, text string) ([]int, error) {
	if s.tokenizeChat == nil {
		return nil, fmt.Errorf("dialect %s: chat: %w", s.Dialect, ErrNoEndpoint)
	}
	return s.tokenizeChat(ctx, c, baseURL, model, []chatMessage{{Role: "user", Content: text}})
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
	b, err = ReadAnswer(c, req, maxTokenizeBody)
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
