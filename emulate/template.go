package emulate

import (
	"errors"
	"slices"
	"strings"

	"github.com/kvload-exporter/kvload-exporter/prompt"
	"github.com/kvload-exporter/kvload-exporter/tokenizer"
)

// pieces returns the text of each token, for /tokenize's token_strs.
func pieces(tok tokenizer.Tokenizer, ids []int) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		s, err := decode(tok, []int{id})
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// decode turns ids into text. The tokenizer does not decode the special
// token that stands in for BOS, so that one is spelled here.
func decode(tok tokenizer.Tokenizer, ids []int) (string, error) {
	var b strings.Builder
	for len(ids) > 0 {
		i := slices.Index(ids, bosToken)
		if i < 0 {
			i = len(ids)
		}
		s, err := tok.Decode(ids[:i])
		if err != nil {
			return "", err
		}
		b.WriteString(s)
		if i < len(ids) {
			b.WriteString(bosText)
			i++
		}
		ids = ids[i:]
	}
	return b.String(), nil
}

// renderChat applies the project's chat template (prompt.RenderChatML). The
// result is tokenized as plain text: o200k_base has no <|im_start|> token, so
// each marker costs a few ordinary tokens. That is enough for what the
// emulator models: a fixed per-message overhead, and a rendering whose
// earlier turns are a token-exact prefix of later turns (each marker starts a
// new pre-token), so multi-turn chats hit the prefix cache. A text-only
// model rejects image and audio parts, and so does the emulator.
func renderChat(msgs []prompt.ChatMessage, addGenerationPrompt bool) (string, error) {
	text, skipped, err := prompt.RenderChatML(msgs, addGenerationPrompt)
	if err != nil {
		return "", err
	}
	if skipped > 0 {
		return "", errors.New("only content parts of type text are supported")
	}
	return text, nil
}

// outputWords are what the emulator generates, cycled: each is a single
// o200k_base token when preceded by a space, and so is each word of their
// concatenation, so a client that re-tokenizes the output counts exactly
// completion_tokens (checked by a test).
const outputWords = "the model writes a steady stream of short plain words and each one is a single token so counts stay exact"

// outputPieces returns the text of the output tokens, one per token.
func outputPieces() []string {
	words := strings.Fields(outputWords)
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = " " + w
	}
	return out
}
