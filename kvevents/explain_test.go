package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// sinkRecorder is a Sink that keeps what it hears.
type sinkRecorder struct {
	mu           sync.Mutex
	tokens       map[Class]int
	unclassified map[UnclassifiedReason]int
}

func newSinkRecorder() *sinkRecorder {
	return &sinkRecorder{tokens: map[Class]int{}, unclassified: map[UnclassifiedReason]int{}}
}

func (s *sinkRecorder) MissedHitTokens(w, t string, c Class, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[c] += n
}

func (s *sinkRecorder) MissedHitUnclassified(w, t string, r UnclassifiedReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unclassified[r]++
}

func (s *sinkRecorder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprint(s.tokens, s.unclassified)
}

// TestExplainer: jobs are classified off the caller's path, and each way
// one cannot be is counted by its reason.
func TestExplainer(t *testing.T) {
	followed, _ := replay(t, promptStored, step{2, []Event{removed(13)}, -1})
	notFollowed := NewStream("tcp://test:2")
	sink := newSinkRecorder()
	e := NewExplainer(sink, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx)
	}()
	ids := func(context.Context) ([]uint32, error) { return prompt, nil }
	miss := Miss{From: 4, To: 12, BlockSize: 4, Sent: at(5), Until: at(6)}
	e.Offer(Job{Workload: "w", Target: "t", Streams: []*Stream{followed}, Tokens: ids, Miss: miss, Done: at(6)})
	e.Offer(Job{Workload: "w", Target: "t", Streams: []*Stream{followed}, Miss: miss, Done: at(6),
		Tokens: func(context.Context) ([]uint32, error) { return nil, errors.New("no tokenize route") }})
	e.Offer(Job{Workload: "w", Target: "t", Streams: []*Stream{followed, notFollowed}, Tokens: ids, Miss: miss, Done: at(6)})
	testutil.Eventually(t, "three jobs done", func() (bool, string) {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.tokens[ClassEvicted] == 4 && sink.tokens[ClassUnexplained] == 4 &&
			sink.unclassified[UnclassifiedTokenize] == 1 && sink.unclassified[UnclassifiedNoStream] == 1, ""
	})
	cancel()
	testutil.Wait(t, "Run to return", done)

	// Run has ended: the queue fills, and the rest is counted.
	for range queueLen + 3 {
		e.Offer(Job{Workload: "w", Target: "t", Streams: []*Stream{followed}, Tokens: ids, Miss: miss})
	}
	if got := sink.unclassified[UnclassifiedQueueFull]; got != 3 {
		t.Errorf("%d jobs counted as queue_full, want 3: %v", got, sink)
	}
}

// TestExplainerQueuedBytes: the prompts of the jobs waiting hold at most
// maxQueuedBytes together, the job that would pass it counted as
// queue_full, and a job classified gives its bytes back.
func TestExplainerQueuedBytes(t *testing.T) {
	sink := newSinkRecorder()
	e := NewExplainer(sink, 1)
	big := Job{Workload: "w", Target: "t", Bytes: maxQueuedBytes / 2,
		Tokens: func(context.Context) ([]uint32, error) { return nil, errors.New("not asked") }}
	for range 3 {
		e.Offer(big)
	}
	if got := sink.unclassified[UnclassifiedQueueFull]; got != 1 || len(e.jobs) != 2 {
		t.Fatalf("%d queued, %d counted as queue_full; want 2, 1", len(e.jobs), got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx)
	}()
	testutil.Eventually(t, "both classified and their bytes given back", func() (bool, string) {
		return e.queued.Load() == 0 && len(e.jobs) == 0, fmt.Sprint(e.queued.Load())
	})
	cancel()
	testutil.Wait(t, "Run to return", done)
	e.Offer(big)
	if len(e.jobs) != 1 {
		t.Errorf("after the queue emptied: %d queued, want 1", len(e.jobs))
	}
}

// TestStartTargetMaxBlocks: the configured bound reaches every stream, 0
// leaving the default.
func TestStartTargetMaxBlocks(t *testing.T) {
	for _, c := range []struct{ configured, want int }{{0, DefaultMaxBlocks}, {5, 5}} {
		tg := StartTarget(t.Context(), []string{"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"}, nil, c.configured, newRecorder())
		tg.Stop()
		for _, s := range tg.Streams {
			if s.maxAlive != c.want || s.maxHashIDs != c.want {
				t.Errorf("configured %d: a stream holding %d blocks and %d hashes, want %d", c.configured, s.maxAlive, s.maxHashIDs, c.want)
			}
		}
	}
}

// TestExplainerStopsWithTarget: a target stopped (and its series deleted)
// while its requests are queued or being classified hears nothing of
// them after Stop returns, though the explainer goes on classifying the
// requests of the other targets.
func TestExplainerStopsWithTarget(t *testing.T) {
	followed, _ := replay(t, promptStored, step{2, []Event{removed(13)}, -1})
	gone := StartTarget(t.Context(), nil, nil, 0, newRecorder())
	kept := StartTarget(t.Context(), nil, nil, 0, newRecorder())
	t.Cleanup(kept.Stop)
	sink := newSinkRecorder()
	e := NewExplainer(sink, 1) // one worker: the jobs go in order
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx)
	}()
	defer func() {
		cancel()
		testutil.Wait(t, "Run to return", done)
	}()
	tokenizing, release := make(chan struct{}), make(chan struct{})
	miss := Miss{From: 8, To: 12, BlockSize: 4, Sent: at(5), Until: at(6)}
	// Being classified when the target stops: its tokens come after.
	e.Offer(Job{Workload: "w", Target: "gone", From: gone, Streams: []*Stream{followed}, Miss: miss, Done: at(6),
		Tokens: func(ctx context.Context) ([]uint32, error) {
			close(tokenizing)
			<-release
			return prompt, nil
		}})
	ids := func(context.Context) ([]uint32, error) { return prompt, nil }
	// Queued behind it, then the other target's.
	e.Offer(Job{Workload: "w", Target: "gone", From: gone, Streams: []*Stream{followed}, Tokens: ids, Miss: miss, Done: at(6)})
	e.Offer(Job{Workload: "w", Target: "kept", From: kept, Streams: []*Stream{followed}, Tokens: ids, Miss: miss, Done: at(6)})
	testutil.Wait(t, "the first job's tokens asked for", tokenizing)
	gone.Stop()
	close(release)
	// The other target's job, the last queued, is reported: the two
	// before it are done.
	testutil.Eventually(t, "the other target's job reported", func() (bool, string) {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.tokens[ClassEvicted] > 0, ""
	})
	if got := sink.String(); got != fmt.Sprint(map[Class]int{ClassEvicted: 4}, map[UnclassifiedReason]int{}) {
		t.Errorf("heard %s: want only the other target's 4 evicted tokens", got)
	}
	// After Stop, the target's own reports are refused too.
	gone.Report(func() { t.Error("a report ran after the target stopped") })
}
