package openai

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/prometheus/common/config"
)

// socketSlack is what the kernel's socket buffers and the transport's
// bufio may hold of a body that the client never read: a server writing
// into a connection whose reader stopped gets this far before its writes
// block or fail. Loopback buffers autotune to a few MiB each way.
const socketSlack = 24 << 20

// floodHandler answers with status and content type, then writes prefix
// followed by filler bytes up to total, and reports on written how many
// bytes the connection accepted before the client went away.
func floodHandler(status int, contentType, prefix string, filler byte, total int, written chan<- int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := 0
		defer func() { written <- n }()
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		k, err := w.Write([]byte(prefix))
		n += k
		if err != nil {
			return
		}
		chunk := []byte(strings.Repeat(string(filler), 64<<10))
		rc := http.NewResponseController(w)
		for n < total {
			k, err := w.Write(chunk[:min(len(chunk), total-n)])
			n += k
			if err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

func waitWritten(t *testing.T, written <-chan int) int {
	t.Helper()
	select {
	case n := <-written:
		return n
	case <-time.After(30 * time.Second):
		t.Fatal("the server's handler never ended: the client kept the connection open")
		return 0
	}
}

// TestClientBoundsServerBodies: a server that sends 50 MB of error body, or
// an SSE event beyond the 16 MiB limit, gets only a bounded part of it read;
// the request ends with a short error text.
func TestClientBoundsServerBodies(t *testing.T) {
	const total = 50 << 20
	tests := []struct {
		name        string
		status      int
		contentType string
		prefix      string
		filler      byte
		total       int
		outcome     Outcome
		errSub      string
		maxRead     int // bytes the client may have consumed
	}{
		{"text error body", 500, "text/plain", "", 'x', total, OutcomeHTTPError, "HTTP 500: xxxx", maxErrorBody},
		{"JSON error body", 401, "application/json", `{"error":{"message":"`, 'y', total, OutcomeHTTPError, `HTTP 401: {"error":{"message":"yyyy`, maxErrorBody},
		{"SSE line over the limit", 200, "text/event-stream", "data: ", 'z', 4 * sseMaxEvent, OutcomeStreamError, "exceeds 16 MiB", sseMaxEvent + sseInitialBuffer},
		// Many lines of one event: the joined data is what is bounded.
		{"SSE event over the limit", 200, "text/event-stream", "", '\n', 4 * sseMaxEvent, OutcomeStreamError, "exceeds 16 MiB", sseMaxEvent + sseInitialBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			written := make(chan int, 1)
			h := floodHandler(tt.status, tt.contentType, tt.prefix, tt.filler, tt.total, written)
			if tt.filler == '\n' {
				// "data: <1 MiB>\n" repeated, never a blank line.
				line := "data: " + strings.Repeat("w", 1<<20) + "\n"
				h = func(w http.ResponseWriter, r *http.Request) {
					n := 0
					defer func() { written <- n }()
					w.Header().Set("Content-Type", tt.contentType)
					for n < tt.total {
						k, err := w.Write([]byte(line))
						n += k
						if err != nil {
							return
						}
					}
				}
			}
			srv := newServer(t, h)
			c := mustClient(t, TargetConfig{URL: srv.URL, Dialect: engine.DialectVLLM})
			var res Response
			c.Do(context.Background(), Request{Prompt: "x"}, &res)
			n := waitWritten(t, written)
			t.Logf("server wrote %d of %d bytes; Error %q", n, tt.total, res.Error)
			if res.Outcome != tt.outcome {
				t.Errorf("outcome %s, want %s", res.Outcome, tt.outcome)
			}
			if !strings.Contains(res.Error, tt.errSub) {
				t.Errorf("Error %q lacks %q", res.Error, tt.errSub)
			}
			if len(res.Error) > maxErrorText+len("…") {
				t.Errorf("Error is %d bytes, want at most %d", len(res.Error), maxErrorText+len("…"))
			}
			if n >= tt.total || n > tt.maxRead+socketSlack {
				t.Errorf("the server got %d bytes out: the client read about %d, want at most %d", n, n-socketSlack, tt.maxRead)
			}
		})
	}
}

// TestClientScrubsFileSecrets: credentials read from files are scrubbed
// from error texts like inline ones, in every form a server may echo them,
// also after the file was rotated.
func TestClientScrubsFileSecrets(t *testing.T) {
	dir := t.TempDir()
	writeSecret := func(name, value string) string {
		p := filepath.Join(dir, name)
		// A trailing newline, as editors and kubectl leave it: prometheus/common trims it.
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokenFile := writeSecret("token", "tok-F1le-9q8w7e")
	passFile := writeSecret("password", "pa55-F1le-zx81")

	var (
		mu       sync.Mutex
		lastAuth string
	)
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		mu.Lock()
		lastAuth = auth
		mu.Unlock()
		_, cred, _ := strings.Cut(auth, " ")
		if strings.HasPrefix(auth, "Basic ") {
			b, _ := base64.StdEncoding.DecodeString(cred)
			_, cred, _ = strings.Cut(string(b), ":")
		}
		w.WriteHeader(http.StatusUnauthorized)
		switch r.URL.Query().Get("shape") {
		case "json":
			fmt.Fprintf(w, `{"error":{"message":"credential %s rejected (header '%s')","type":"authentication_error"}}`, cred, auth)
		default:
			// Bytes 294 to 300 of the body are the secret's first six,
			// and the run of spaces collapses: a cut at maxErrorText
			// made before the secrets are replaced would keep them.
			fmt.Fprintf(w, "a%s%s%s", strings.Repeat(" ", 40), strings.Repeat("-", maxErrorText-41-6), cred)
		}
	})
	srv := newServer(t, echo)

	tests := []struct {
		name   string
		file   string
		hc     config.HTTPClientConfig
		header func(secret string) string
	}{
		{"credentials_file", tokenFile,
			config.HTTPClientConfig{Authorization: &config.Authorization{Type: "Bearer", CredentialsFile: tokenFile}},
			func(s string) string { return "Bearer " + s }},
		{"password_file", passFile,
			config.HTTPClientConfig{BasicAuth: &config.BasicAuth{Username: "alice", PasswordFile: passFile}},
			func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+s)) }},
	}
	for _, tt := range tests {
		for _, shape := range []string{"json", "text"} {
			t.Run(tt.name+"/"+shape, func(t *testing.T) {
				c := mustClient(t, TargetConfig{URL: srv.URL + "?shape=" + shape, HTTPClientConfig: tt.hc})
				for i, secret := range []string{"", "r0tated-" + tt.name + "-" + shape + "-5k3"} {
					if secret != "" {
						writeSecret(filepath.Base(tt.file), secret)
					} else {
						b, _ := os.ReadFile(tt.file)
						secret = strings.TrimSpace(string(b))
					}
					var res Response
					c.Do(context.Background(), Request{Prompt: "x"}, &res)
					mu.Lock()
					got := lastAuth
					mu.Unlock()
					if want := tt.header(secret); got != want {
						t.Fatalf("request %d: the server saw Authorization %q, want %q", i, got, want)
					}
					if res.Outcome != OutcomeHTTPError || !strings.Contains(res.Error, "<secret>") {
						t.Errorf("request %d: %s %q, want http_error with <secret>", i, res.Outcome, res.Error)
					}
					for _, part := range []string{secret, secret[:6], tt.header(secret)} {
						if strings.Contains(res.Error, part) {
							t.Errorf("request %d: Error %q holds %q", i, res.Error, part)
						}
					}
				}
			})
		}
	}
}
