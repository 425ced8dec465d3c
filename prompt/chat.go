package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// ChatMessage is an OpenAI chat message, as far as rendering it to prompt
// text needs. Content may be a string, null, or a list of content parts.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// RenderChatML renders messages with the project's chat template, a minimal
// ChatML (the shape Qwen and many other chat models use):
//
//	<|im_start|>{role}\n{content}<|im_end|>\n   for every message, then
//	<|im_start|>assistant\n                      with generationPrompt
//
// It is no model's exact template (those are Jinja in each model's
// tokenizer_config.json); it is one stable rendering shared by the hasher and
// the emulator, so that equal conversation prefixes give equal token
// prefixes everywhere in this project. String content is used as it is; the
// text of {"type": "text"} parts is joined with newlines, as vLLM does for
// text-only templates; null content (a tool-call-only turn) is empty. Other
// parts (images, audio) are left out and counted in skipped; tool calls and
// names are not rendered.
func RenderChatML(msgs []ChatMessage, generationPrompt bool) (text string, skipped int, err error) {
	var b strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return "", 0, fmt.Errorf("messages[%d]: has no role", i)
		}
		content, n, err := messageText(m.Content)
		if err != nil {
			return "", 0, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		skipped += n
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteString("\n")
		b.WriteString(content)
		b.WriteString("<|im_end|>\n")
	}
	if generationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), skipped, nil
}

func messageText(raw json.RawMessage) (string, int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", 0, err
		}
		return s, 0, nil
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", 0, fmt.Errorf("must be a string or a list of content parts: %w", err)
		}
		texts := make([]string, 0, len(parts))
		skipped := 0
		for _, p := range parts {
			if p.Type != "text" || p.Text == nil {
				skipped++
				continue
			}
			texts = append(texts, *p.Text)
		}
		return strings.Join(texts, "\n"), skipped, nil
	default:
		return "", 0, errors.New("must be a string, a list of content parts or null, got " + trace.JSONKind(raw))
	}
}
