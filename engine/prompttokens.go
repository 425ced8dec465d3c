package engine

import (
	"context"
	"fmt"
	"net/http"
)

// promptTokenizer reads the ids an engine's generation routes make of a
// prompt: on completions the prompt with the special tokens the route
// adds, on chat one user message with the chat template.
type promptTokenizer func(ctx context.Context, c *http.Client, base, model, text string, chat bool, each func(int)) (int, error)

// CanTokenizePrompts tells whether TokenizePrompt can ask the engine.
func (s *Spec) CanTokenizePrompts() bool { return s.promptTokens != nil }

// TokenizePrompt hands each id, in order, that the engine's completions
// route (chat: its chat route, text as one user message) makes of text:
// the ids its prefix cache keys blocks by. Its error wraps ErrNoEndpoint
// for an engine CanTokenizePrompts refuses.
func (s *Spec) TokenizePrompt(ctx context.Context, c *http.Client, baseURL, model, text string, chat bool, each func(id int)) (int, error) {
	if s.promptTokens == nil {
		return 0, fmt.Errorf("dialect %s: prompt ids: %w", s.Dialect, ErrNoEndpoint)
	}
	return s.promptTokens(ctx, c, baseURL, model, text, chat, each)
}

// vllmPromptTokens asks vLLM's /tokenize: the prompt with its special
// tokens, as /v1/completions adds them by default, or the chat form, as
// /v1/chat/completions renders it.
func vllmPromptTokens(ctx context.Context, c *http.Client, base, model, text string, chat bool, each func(int)) (int, error) {
	if chat {
		msgs := []chatMessage{{Role: "user", Content: text}}
		return postTokens(ctx, c, base, "/tokenize", vllmChatBody{Model: model, Messages: msgs, AddGenerationPrompt: true},
			tokenLimit(messagesBytes(msgs), true), each)
	}
	body := struct {
		Model            string `json:"model,omitempty"`
		Prompt           string `json:"prompt"`
		AddSpecialTokens bool   `json:"add_special_tokens"`
	}{Model: model, Prompt: text, AddSpecialTokens: true}
	return postTokens(ctx, c, base, "/tokenize", body, tokenLimit(len(text), false), each)
}
