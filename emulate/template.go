package emulate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/tiktoken-go/tokenizer"
)

// textTokenizer is o200k_base, a real byte-level BPE, so that prompt
// lengths and shared prefixes behave as on a real model. It is safe for
// concurrent use.
type textTokenizer struct{ c tokenizer.Codec }

func newTextTokenizer() (textTokenizer, error) {
	c, err := tokenizer.Get(tokenizer.O200kBase)
	if err != nil {
		return textTokenizer{}, fmt.Errorf("emulate: tokenizer: %w", err)
	}
	return textTokenizer{c}, nil
}

// encode tokenizes text as plain text: strings that spell special tokens
// are split like any other text, and nothing is added around it.
func (t textTokenizer) encode(text string) ([]int, error) {
	ids, _, err := t.c.Encode(text)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out, nil
}

// pieces returns the text of each token, for /tokenize's token_strs.
func (t textTokenizer) pieces(ids []int) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		s, err := t.c.Decode([]uint{uint(id)})
		if err != nil {
			return nil, fmt.Errorf("detokenize: %w", err)
		}
		out[i] = s
	}
	return out, nil
}

func (t textTokenizer) decode(ids []int) (string, error) {
	u := make([]uint, len(ids))
	for i, id := range ids {
		if id < 0 {
			return "", fmt.Errorf("detokenize: negative token id %d", id)
		}
		u[i] = uint(id)
	}
	s, err := t.c.Decode(u)
	if err != nil {
		return "", fmt.Errorf("detokenize: %w", err)
	}
	return s, nil
}

// chatMessage is one entry of a request's messages. Content may be a
// string, null, or a list of parts of which only text parts are accepted.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// renderChat applies the emulator's chat template, a minimal ChatML:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n     for each message
//	<|im_start|>assistant\n                         if addGenerationPrompt
//
// The result is tokenized as plain text: o200k_base has no <|im_start|>
// token, so each marker costs a few ordinary tokens. That is enough for
// what the emulator models: a fixed per-message overhead, and a rendering
// whose earlier turns are a token-exact prefix of later turns (each marker
// starts a new pre-token), so multi-turn chats hit the prefix cache.
func renderChat(msgs []chatMessage, addGenerationPrompt bool) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("messages[%d]: role is required", i)
		}
		content, err := messageText(m.Content)
		if err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteString("\n")
		b.WriteString(content)
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

// messageText flattens a message's content. Text parts are joined with
// newlines, as vLLM's chat preprocessing does for string-only templates.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("content: %w", err)
		}
		return s, nil
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", fmt.Errorf("content: %w", err)
		}
		texts := make([]string, 0, len(parts))
		for j, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", fmt.Errorf("content[%d]: only parts of type text with a text field are supported, got type %q", j, p.Type)
			}
			texts = append(texts, *p.Text)
		}
		return strings.Join(texts, "\n"), nil
	default:
		return "", errors.New("content must be a string, a list of text parts, or null")
	}
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
