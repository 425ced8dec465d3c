package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// sinkStats is what the sink saw since its last reset: how many streams
// it served and when the first and the last request arrived. Both load
// tools are timed by the same clock this way.
type sinkStats struct {
	Requests int64 `json:"requests"`
	First    int64 `json:"first_unix_nano"`
	Last     int64 `json:"last_unix_nano"`
}

type sink struct {
	stream [][]byte // the SSE events of one response, written perWrite at a time

	// perWrite is how many events go out in one write and flush: 1, as a
	// real engine sends each token as it is made, or more for a sink that
	// costs less than the client it serves.
	perWrite int

	mu    sync.Mutex
	stats sinkStats
}

// newSink prepares a tokens-token OpenAI chat stream shaped
// like vLLM's: a role chunk, the content chunks, a finish chunk, a usage
// chunk and [DONE].
func newSink(tokens, perWrite int) *sink {
	const head = `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1761523200,"model":"bench","choices":[{"index":0,"delta":{`
	const tail = `},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	words := []string{" the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog"}
	s := &sink{perWrite: max(perWrite, 1)}
	s.stream = append(s.stream, []byte(head+`"role":"assistant","content":""`+tail))
	for i := range tokens {
		s.stream = append(s.stream, []byte(head+`"content":"`+words[i%len(words)]+`"`+tail))
	}
	s.stream = append(s.stream,
		[]byte(head+`"content":""},"logprobs":null,"finish_reason":"length"}]}`+"\n\n"),
		[]byte(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1761523200,"model":"bench","choices":[],"usage":{"prompt_tokens":64,"total_tokens":`+
			strconv.Itoa(64+tokens)+`,"completion_tokens":`+strconv.Itoa(tokens)+`}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return s
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/stats":
		s.mu.Lock()
		st := s.stats
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(st)
		return
	case "/reset":
		s.mu.Lock()
		s.stats = sinkStats{}
		s.mu.Unlock()
		return
	}
	now := time.Now().UnixNano()
	s.mu.Lock()
	s.stats.Requests++
	if s.stats.First == 0 {
		s.stats.First = now
	}
	s.stats.Last = now
	s.mu.Unlock()
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for i, ev := range s.stream {
		if _, err := w.Write(ev); err != nil {
			return
		}
		if (i+1)%s.perWrite != 0 && i+1 < len(s.stream) {
			continue
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// runSink serves until SIGTERM or SIGINT; it prints its address first.
// Its arguments: [ADDR [EVENTS-PER-WRITE [TOKENS]]].
func runSink(args []string) error {
	addr, tokens, perWrite := "127.0.0.1:0", 32, 1
	if len(args) > 0 {
		addr = args[0]
	}
	if len(args) > 1 {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 {
			return fmt.Errorf("sink: events per write %q: want a positive integer", args[1])
		}
		perWrite = n
	}
	if len(args) > 2 {
		n, err := strconv.Atoi(args[2])
		if err != nil || n < 1 {
			return fmt.Errorf("sink: tokens %q: want a positive integer", args[2])
		}
		tokens = n
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	fmt.Println(ln.Addr().String())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv := &http.Server{Handler: newSink(tokens, perWrite), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sink: %w", err)
	}
	return nil
}
