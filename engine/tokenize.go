package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// ErrNoEndpoint means the engine has no tokenize endpoint of the kind
// asked for.
var ErrNoEndpoint = errors.New("the engine has no tokenize endpoint")

// ErrTooManyTokens means a tokenize answer counts more tokens than the
// text sent could have: no tokenizer makes more than one token of a byte,
// so such an answer is not a count of that text.
var ErrTooManyTokens = errors.New("more tokens than the text sent could have")

// maxTokenizeBody bounds what is read of one tokenize answer: the ids the
// exporter's check of a 512-token prompt may accept, with llama.cpp's
// pieces, are about 100 KiB. The JSON decoder keeps a run of blanks
// whole, so the bound is also what one answer may cost in memory.
const maxTokenizeBody = 1 << 20

// maxExtraTokens is what a tokenizer may add to a text besides its own
// tokens: a BOS, an EOS, a few control tokens.
const maxExtraTokens = 16

// MaxChatTemplateTokens bounds a believable chat template: a larger
// difference between a chat's count and its text's is a tokenizer unlike
// the server's chat route, not a template.
const MaxChatTemplateTokens = 1024

// maxTemplateBytes bounds the text a chat template may add to the
// messages it renders, for engines that render it for the exporter to
// tokenize (llama.cpp's /apply-template).
const maxTemplateBytes = 64 * MaxChatTemplateTokens

// tokenLimit is the most tokens a text of n bytes may count, plus a chat
// template's where template is set.
func tokenLimit(n int, template bool) int {
	if template {
		return n + maxExtraTokens + MaxChatTemplateTokens
	}
	return n + maxExtraTokens
}

// tokenizeRoute is one engine's tokenize route and the body it takes.
type tokenizeRoute struct {
	path string
	body func(model, text string) any
}

// chatTokenizer counts the tokens of a chat as the engine's chat endpoint
// counts them.
type chatTokenizer func(ctx context.Context, c *http.Client, base, model string, msgs []chatMessage) (int, error)

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

// Tokenize counts the ids the server at baseURL (without /v1) makes of
// text, without special tokens where the engine allows leaving them out,
// and hands each id, in order, to each (nil: count only). The answer is
// read as a stream, never whole: a count beyond what text could make
// fails with ErrTooManyTokens as soon as it is passed. Its error wraps
// ErrNoEndpoint for an engine without an endpoint.
func (s *Spec) Tokenize(ctx context.Context, c *http.Client, baseURL, model, text string, each func(id int)) (int, error) {
	if s.tokenize == nil {
		return 0, fmt.Errorf("dialect %s: %w", s.Dialect, ErrNoEndpoint)
	}
	return postTokens(ctx, c, baseURL, s.tokenize.path, s.tokenize.body(model, text), tokenLimit(len(text), false), each)
}

// TokenizeChat counts the tokens the server at baseURL makes of a chat of
// one user message, text, as its chat completions endpoint counts them:
// the chat template included. Its error wraps ErrNoEndpoint for an engine
// CanTokenizeChat refuses.
func (s *Spec) TokenizeChat(ctx context.Context, c *http.Client, baseURL, model, text string) (int, error) {
	if s.tokenizeChat == nil {
		return 0, fmt.Errorf("dialect %s: chat: %w", s.Dialect, ErrNoEndpoint)
	}
	return s.tokenizeChat(ctx, c, baseURL, model, []chatMessage{{Role: "user", Content: text}})
}

// open sends body as JSON to baseURL+path and opens the answer (see
// OpenAnswer); where is the route, credentials redacted, for errors about
// the answer.
func open(ctx context.Context, c *http.Client, baseURL, path string, body any) (_ io.ReadCloser, where string, _ error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	where = "POST " + req.URL.Redacted()
	rc, err := OpenAnswer(c, req, maxTokenizeBody)
	return rc, where, err
}

// postTokens posts body to baseURL+path and counts the ids of its answer
// (CountTokens), at most limit.
func postTokens(ctx context.Context, c *http.Client, baseURL, path string, body any, limit int, each func(int)) (int, error) {
	rc, where, err := open(ctx, c, baseURL, path, body)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := CountTokens(rc, limit, each)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", where, err)
	}
	return n, nil
}

// CountTokens reads a tokenize answer as a stream: an object whose
// "tokens" is a list of ids (vLLM, SGLang, Dynamo, TensorRT-LLM,
// llama.cpp) or of {id, piece} (llama.cpp with_pieces), with an optional
// "count" that must agree. It hands each id to each (when not nil) and
// returns how many there are, keeping none: more than limit fail with
// ErrTooManyTokens at once, without reading further.
func CountTokens(r io.Reader, limit int, each func(id int)) (int, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	if err := expectDelim(dec, '{'); err != nil {
		return 0, fmt.Errorf("tokenize answer is not a JSON object with tokens: %w", err)
	}
	n, count := -1, -1
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return 0, fmt.Errorf("tokenize answer: %w", err)
		}
		switch key {
		case "tokens":
			if n >= 0 {
				return 0, errors.New("tokenize answer has two tokens lists")
			}
			if n, err = countIDs(dec, limit, each); err != nil {
				return 0, err
			}
		case "count":
			if count >= 0 {
				return 0, errors.New("tokenize answer has two counts")
			}
			c, err := intToken(dec)
			if err != nil || c < 0 {
				return 0, errors.New("tokenize answer: its count is not a whole number of tokens")
			}
			count = c
		default:
			if err := skipValue(dec); err != nil {
				return 0, fmt.Errorf("tokenize answer: %w", err)
			}
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return 0, fmt.Errorf("tokenize answer: %w", err)
	}
	switch t, err := dec.Token(); {
	case err == nil:
		return 0, fmt.Errorf("tokenize answer: more after its object: %.40v", t)
	case !errors.Is(err, io.EOF):
		return 0, fmt.Errorf("tokenize answer: after its object: %w", err)
	}
	if n < 0 {
		return 0, errors.New("tokenize answer has no tokens list")
	}
	if count >= 0 && count != n {
		return 0, fmt.Errorf("tokenize answer: count %d but %d tokens", count, n)
	}
	return n, nil
}

// countIDs reads the tokens list, the decoder standing before it.
func countIDs(dec *json.Decoder, limit int, each func(int)) (int, error) {
	t, err := dec.Token()
	if err != nil {
		return 0, fmt.Errorf("tokenize answer: %w", err)
	}
	if t != json.Delim('[') {
		return 0, errors.New("tokenize answer has no tokens list")
	}
	n := 0
	for ; dec.More(); n++ {
		if n == limit {
			return 0, fmt.Errorf("tokenize answer: more than %d tokens, %w", limit, ErrTooManyTokens)
		}
		id, err := tokenID(dec)
		if err != nil {
			return 0, fmt.Errorf("tokenize answer: token %d is %w", n, err)
		}
		if each != nil {
			each(id)
		}
	}
	if err := expectDelim(dec, ']'); err != nil {
		return 0, fmt.Errorf("tokenize answer: %w", err)
	}
	return n, nil
}

// errNotAnID is what a token that is neither an id nor {id, piece} is.
var errNotAnID = errors.New("neither an id nor {id, piece}")

// tokenID reads one element of the tokens list: an id, or an object with
// an id and anything else (llama.cpp's piece).
func tokenID(dec *json.Decoder) (int, error) {
	t, err := dec.Token()
	if err != nil {
		return 0, err
	}
	switch v := t.(type) {
	case json.Number:
		id, err := strconv.Atoi(v.String())
		if err != nil {
			return 0, fmt.Errorf("%.40s, %w", v, errNotAnID)
		}
		return id, nil
	case json.Delim:
		if v != '{' {
			return 0, fmt.Errorf("a list, %w", errNotAnID)
		}
	default:
		return 0, fmt.Errorf("%.40v, %w", v, errNotAnID)
	}
	id, found := 0, false
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return 0, err
		}
		if key != "id" {
			if err := skipValue(dec); err != nil {
				return 0, err
			}
			continue
		}
		if id, err = intToken(dec); err != nil {
			return 0, fmt.Errorf("an object whose id is not one, %w", errNotAnID)
		}
		found = true
	}
	if err := expectDelim(dec, '}'); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("an object without id, %w", errNotAnID)
	}
	return id, nil
}

// intToken reads the next value as a whole number that fits an int.
func intToken(dec *json.Decoder) (int, error) {
	t, err := dec.Token()
	if err != nil {
		return 0, err
	}
	num, ok := t.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%.40v is not a number", t)
	}
	return strconv.Atoi(num.String())
}

// expectDelim reads the next token, which must be d.
func expectDelim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return fmt.Errorf("%.40v where %v belongs", t, d)
	}
	return nil
}

// skipValue reads past the next value, whatever it holds, token by token.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// messagesBytes is the length of the messages' text.
func messagesBytes(msgs []chatMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content)
	}
	return n
}
