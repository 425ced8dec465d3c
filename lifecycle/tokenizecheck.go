package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

const (
	// tokenizeCheckTokens is the length of the prompt checked: one trace
	// block, so that a ratio of a few percent is tens of tokens.
	tokenizeCheckTokens = 512
	// tokenizeWarnRatio: a server counting the exporter's prompts more than
	// 2 % off gets a warning.
	tokenizeWarnRatio = 0.02
)

// checkTokenizer has target t's own tokenizer, through its tokenize
// endpoint, count a prompt built as every prompt is, and logs and exports
// the ratio of its count to the built one, warning when it is more than 2 %
// off: the server then receives prompts of another length than the trace
// asks for. With token-id prompts it also compares the ids: a tokenizer:
// unlike the server's sends ids that mean other text. Engines without an
// endpoint, or that do not answer within discoverTimeout, are logged and
// not checked. On chat, where the endpoint renders messages, it also
// returns the size of the target's chat template (known false otherwise),
// so that prompts leave it room from the first request on.
func (l *layoutSet) checkTokenizer(ctx context.Context, t *config.Target) (template int, known bool) {
	dialect := t.Dialect
	logger := log.With(l.logger, "target", t.Name)
	if !engine.For(dialect).CanTokenize() {
		l.coll.SetTokenizeRatio(t.Name, 0, false)
		level.Debug(logger).Log("msg", "prompt length not checked: the engine has no tokenize endpoint", "dialect", dialect)
		return 0, false
	}
	res, err := l.tokenizeCheck(ctx, t)
	switch {
	case err != nil && ctx.Err() != nil:
		return 0, false // shutting down: the check says nothing of the target
	case errors.Is(err, engine.ErrTooManyTokens):
		l.coll.SetTokenizeRatio(t.Name, 0, false)
		level.Warn(logger).Log("msg", "prompt length not checked: the target's tokenize endpoint counts more tokens than the prompt has bytes, which no tokenizer does", "err", err)
		return 0, false
	case err != nil:
		l.coll.SetTokenizeRatio(t.Name, 0, false)
		level.Info(logger).Log("msg", "prompt length not checked: the target's tokenize endpoint did not answer", "err", err)
		return 0, false
	}
	ratio := float64(res.server) / float64(res.built)
	l.coll.SetTokenizeRatio(t.Name, ratio, true)
	kv := []any{"built_tokens", res.built, "server_tokens", res.server, "ratio", fmt.Sprintf("%.4f", ratio)}
	switch {
	case math.Abs(ratio-1) > tokenizeWarnRatio:
		level.Warn(logger).Log(append([]any{"msg", "the target's tokenizer counts the exporter's prompts more than 2 % off: its prompt lengths (and its cache model's blocks) will be off by that ratio",
			"what_to_do", "prompts are built of words that are one token each in the o200k, cl100k, Qwen3 and Llama-3 vocabularies; for another vocabulary set prompt_format: token_ids and tokenizer: the server's tokenizer.json"}, kv...)...)
	case res.mismatched > 0:
		level.Warn(logger).Log(append([]any{"msg", "tokenizer: does not match the target's: the token ids sent stand for other text on the server",
			"tokenizer", t.Tokenizer, "mismatched_ids", res.mismatched, "what_to_do", "set tokenizer: to the server's tokenizer.json"}, kv...)...)
	default:
		level.Info(logger).Log(append([]any{"msg", "prompt length checked against the target's tokenizer"}, kv...)...)
	}
	switch {
	case res.templateErr != nil:
		level.Info(logger).Log("msg", "chat template not measured through the tokenize endpoint; its size is learnt from the first answers' prompt_tokens instead", "err", res.templateErr)
	case res.templateKnown:
		level.Info(logger).Log("msg", "chat template overhead read from the target's tokenize endpoint; chat prompts leave it room", "tokens", res.template)
	}
	return res.template, res.templateKnown
}

// tokenizeResult is one check: the tokens built, the server's count, and
// with token-id prompts how many of the server's ids differ from the
// exporter's tokenizer's.
type tokenizeResult struct {
	built, server, mismatched int
	// On chat: the server's count of the prompt as one user message, less
	// its count of the prompt alone, when the endpoint renders messages.
	template      int
	templateKnown bool
	templateErr   error
}

func (l *layoutSet) tokenizeCheck(ctx context.Context, t *config.Target) (tokenizeResult, error) {
	b, err := prompt.NewBuilder(prompt.Options{BlockSize: tokenizeCheckTokens})
	if err != nil {
		return tokenizeResult{}, err
	}
	text := string(b.AppendBlockText(nil, 0, 0, tokenizeCheckTokens))
	// With token-id prompts, the ids the exporter sends for text: each of
	// the server's is compared as it is read.
	var mine []int
	if t.PromptFormat == openai.PromptFormatTokenIDs {
		tok, err := tokenizer.Load(t.Tokenizer)
		if err != nil {
			return tokenizeResult{}, fmt.Errorf("tokenizer: %w", err)
		}
		if mine, err = tok.Encode(text); err != nil {
			return tokenizeResult{}, fmt.Errorf("tokenizer %s: %w", t.Tokenizer, err)
		}
	}
	client, err := targetHTTPClient(t, "kvload_tokenize_check")
	if err != nil {
		return tokenizeResult{}, fmt.Errorf("target %s: tokenize client: %w", t.Name, err)
	}
	defer client.CloseIdleConnections()
	cctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	base := l.emulators.baseURL(t)
	res := tokenizeResult{built: tokenizeCheckTokens}
	var each func(int)
	if mine != nil {
		each = func(id int) {
			if i := res.server; i >= len(mine) || mine[i] != id {
				res.mismatched++
			}
			res.server++
		}
	}
	n, err := engine.For(t.Dialect).Tokenize(cctx, client, base, t.Model, text, each)
	if err != nil {
		return tokenizeResult{}, fmt.Errorf("target %s: %w", t.Name, err)
	}
	if n == 0 {
		return tokenizeResult{}, fmt.Errorf("target %s: the tokenize endpoint answered no tokens for a non-empty prompt", t.Name)
	}
	res.server = n
	res.mismatched += max(len(mine)-n, 0) // the ids the server's answer lacks
	if mine == nil && t.API == openai.APIChat && engine.For(t.Dialect).CanTokenizeChat() {
		res.template, res.templateKnown, res.templateErr = chatTemplate(cctx, client, base, t, text, n)
	}
	return res, nil
}

// chatTemplate measures the chat template: the server's count of text as a
// chat of one user message, less plain, its count of text alone. A
// difference out of [0, engine.MaxChatTemplateTokens] is an endpoint that
// renders messages unlike the chat route, and is not used.
func chatTemplate(ctx context.Context, c *http.Client, baseURL string, t *config.Target, text string, plain int) (int, bool, error) {
	n, err := engine.For(t.Dialect).TokenizeChat(ctx, c, baseURL, t.Model, text)
	if err != nil {
		return 0, false, err
	}
	if d := n - plain; d < 0 || d > engine.MaxChatTemplateTokens {
		return 0, false, fmt.Errorf("the chat form counts %d tokens against %d for the text alone, not a template", n, plain)
	}
	return n - plain, true, nil
}
