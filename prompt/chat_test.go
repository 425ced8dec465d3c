package prompt

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRenderChatML(t *testing.T) {
	msg := func(role, content string) ChatMessage {
		return ChatMessage{Role: role, Content: json.RawMessage(content)}
	}
	tests := []struct {
		name        string
		msgs        []ChatMessage
		genPrompt   bool
		want        string
		wantSkipped int
		wantErr     string
	}{
		{"string content", []ChatMessage{msg("system", `"Be brief."`), msg("user", `"Hi"`)}, true,
			"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0, ""},
		{"no generation prompt", []ChatMessage{msg("user", `"Hi"`)}, false,
			"<|im_start|>user\nHi<|im_end|>\n", 0, ""},
		{"text parts joined, image skipped", []ChatMessage{msg("user", `[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]`)}, false,
			"<|im_start|>user\na\nb<|im_end|>\n", 1, ""},
		{"null content", []ChatMessage{msg("assistant", `null`)}, false,
			"<|im_start|>assistant\n<|im_end|>\n", 0, ""},
		{"missing role", []ChatMessage{msg("", `"x"`)}, false, "", 0, "messages[0]: has no role"},
		{"numeric content", []ChatMessage{msg("user", `3`)}, false, "", 0, "messages[0].content: must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped, err := RenderChatML(tt.msgs, tt.genPrompt)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want || skipped != tt.wantSkipped {
				t.Errorf("got %q (skipped %d), want %q (skipped %d)", got, skipped, tt.want, tt.wantSkipped)
			}
		})
	}
}
