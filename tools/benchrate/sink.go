package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// sinkStats is what the sink saw since its last reset: how many streams
// it served. When they arrived is in its arrival logs (see sink.received).
type sinkStats struct {
	Requests int64 `json:"requests"`
	// Unstamped counts the requests whose socket gave no receive stamp:
	// their handler's time stands in (see wire.go).
	Unstamped int64 `json:"unstamped"`
}

type sink struct {
	stream [][]byte // the SSE events of one response, written perWrite at a time

	// perWrite is how many events go out in one write and flush: 1, as a
	// real engine sends each token as it is made, or more for a sink that
	// costs less than the client it serves.
	perWrite int

	mu    sync.Mutex
	stats sinkStats
	// The requests' arrival times since the last reset, in Unix
	// nanoseconds, the first maxArrivals of them: each tool's send lag is
	// measured from them the same way (see arrivalLag). received are the
	// kernel's stamps at the sink's socket (wire.go), handled the times the
	// sink's handler began; /arrivals serves the first, ?at=handled the
	// second.
	received, handled []int64
}

// maxArrivals bounds the arrival log: a 10 s run at 20,000/s. benchrate
// refuses a run that would send more (checkRunSize).
const maxArrivals = 200_000

// newSink prepares an OpenAI chat stream of shape.tokens tokens, shaped
// like vLLM's: a role chunk, the content chunks, a finish chunk, a usage
// chunk and [DONE].
func newSink(shape streamShape) *sink {
	tokens := shape.tokens
	const head = `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1761523200,"model":"bench","choices":[{"index":0,"delta":{`
	const tail = `},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	words := []string{" the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog"}
	s := &sink{perWrite: shape.perWrite}
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
		s.received, s.handled = s.received[:0], s.handled[:0]
		s.mu.Unlock()
		return
	case "/arrivals":
		at := r.URL.Query().Get("at")
		if at != "" && at != "received" && at != "handled" {
			// A misspelt kind must not be answered with the other log.
			http.Error(w, fmt.Sprintf("at=%q: want received or handled", at), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		log := s.received
		if at == "handled" {
			log = s.handled
		}
		a := slices.Clone(log)
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(a)
		return
	}
	now := time.Now().UnixNano()
	received := takeReceiveStamp(r.Context())
	s.mu.Lock()
	s.stats.Requests++
	if received == 0 {
		received = now
		s.stats.Unstamped++
	}
	if len(s.handled) < maxArrivals {
		s.handled = append(s.handled, now)
		s.received = append(s.received, received)
	}
	s.mu.Unlock()
	_, _ = io.Copy(io.Discard, r.Body)
	// Body bytes that came in a later segment are this request's, not
	// the next one's.
	takeReceiveStamp(r.Context())
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

// streamShape is what the sink streams: tokens content events, written
// perWrite events at a time.
type streamShape struct {
	tokens, perWrite int
}

func (s streamShape) check() error {
	if s.tokens < 1 || s.perWrite < 1 {
		return fmt.Errorf("tokens %d, events per write %d: want both at least 1", s.tokens, s.perWrite)
	}
	return nil
}

// args are the sink command's flags for s.
func (s streamShape) args() []string {
	return []string{"-tokens", strconv.Itoa(s.tokens), "-events-per-write", strconv.Itoa(s.perWrite)}
}

// runSink serves until SIGTERM or SIGINT; it prints its address first.
func runSink(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	var shape streamShape
	fs.IntVar(&shape.tokens, "tokens", 32, "content events (tokens) of every stream")
	fs.IntVar(&shape.perWrite, "events-per-write", 1, "SSE events written and flushed at once")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	if err := shape.check(); err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	fmt.Println(ln.Addr().String())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv := &http.Server{Handler: newSink(shape), ReadHeaderTimeout: 10 * time.Second, ConnContext: withWireConn}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(newWireListener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sink: %w", err)
	}
	return nil
}
