package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// llama.cpp's llama-server: no cache salt (3.22.1's server source has
// none; its slots and host cache serve every client alike); max_tokens
// and its native n_predict,
// ignore_eos but no min_tokens; its slots reuse any number of tokens of
// the prompt they last served. With --metrics, builds that count cached
// prompt tokens export them; prompt_tokens_total counts only the tokens it
// computed. Its cache size is not read: its RAM prompt cache keeps far
// more than its slots (docs/engines.md).
var _ = register(&Spec{
	Dialect:     DialectLlamaCpp,
	Request:     RequestFields{ChatMaxTokens: "max_tokens", NPredict: true, IgnoreEOS: true},
	BlockSize:   1,
	Granularity: GranularityToken,
	Metrics: Metrics{
		CachedTokens:         families("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_cached"),
		PromptTokens:         families("llamacpp:prompt_tokens_total"),
		PromptExcludesCached: true,
	},
	UnreportedAdvice: serverMetricsAdvice,
	tokenize: &tokenizeRoute{path: "/tokenize", body: func(_, text string) any {
		return llamaCppTokenizeBody{Content: text}
	}},
	tokenizeChat: llamaCppTokenizeChat,
})

type llamaCppTokenizeBody struct {
	Content      string `json:"content"`
	AddSpecial   bool   `json:"add_special"`
	ParseSpecial bool   `json:"parse_special,omitempty"`
}

// llamaCppTemplateBody asks /apply-template for the text its chat endpoint
// would tokenize.
type llamaCppTemplateBody struct {
	Messages []chatMessage `json:"messages"`
}

// llamaCppTokenizeChat renders the chat with /apply-template, then
// tokenizes it as the chat endpoint does: special tokens added where the
// model asks for them, and special-token text in the template read as
// special tokens.
func llamaCppTokenizeChat(ctx context.Context, c *http.Client, base, _ string, msgs []chatMessage) (int, error) {
	rc, where, err := open(ctx, c, base, "/apply-template", llamaCppTemplateBody{Messages: msgs})
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	var rendered struct {
		Prompt *string `json:"prompt"`
	}
	if err := json.NewDecoder(rc).Decode(&rendered); err != nil {
		return 0, fmt.Errorf("%s: the answer has no prompt string: %w", where, err)
	}
	if rendered.Prompt == nil {
		return 0, fmt.Errorf("%s: the answer has no prompt string", where)
	}
	if n, most := len(*rendered.Prompt), messagesBytes(msgs)+maxTemplateBytes; n > most {
		return 0, fmt.Errorf("%s: the rendered chat has %d bytes, more than its messages' and a template's %d: not a rendering of them", where, n, most)
	}
	// The template is in the text sent: its tokens are bounded with it.
	return postTokens(ctx, c, base, "/tokenize", llamaCppTokenizeBody{Content: *rendered.Prompt, AddSpecial: true, ParseSpecial: true},
		tokenLimit(len(*rendered.Prompt), false), nil)
}
