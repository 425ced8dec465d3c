package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// seenContents runs a Watcher on path whose callback reads the file, as the
// daemon does, and records what it read: a test then asserts on what each
// notification saw, not on what the file holds when the test looks.
type seenContents struct {
	mu   sync.Mutex
	seen []string
	news chan struct{} // a value per notification
}

func watchContents(t *testing.T, path string, debounce time.Duration) *seenContents {
	t.Helper()
	w, err := NewWatcher(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &seenContents{news: make(chan struct{}, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		w.Run(ctx, debounce, nil, func() {
			b, err := os.ReadFile(path)
			got := string(b)
			if err != nil {
				got = "read error: " + err.Error()
			}
			s.mu.Lock()
			s.seen = append(s.seen, got)
			s.mu.Unlock()
			s.news <- struct{}{}
		})
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return s
}

// all returns what every notification so far read, in order.
func (s *seenContents) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// waitFor returns once a notification has read want.
func (s *seenContents) waitFor(t *testing.T, want string) {
	t.Helper()
	for !slices.Contains(s.all(), want) {
		testutil.WaitShowing(t, fmt.Sprintf("a notification that reads %q", want), s.news, readSoFar{s})
	}
}

// readSoFar shows what the notifications read, when a wait fails.
type readSoFar struct{ s *seenContents }

func (r readSoFar) String() string { return fmt.Sprintf("notifications read %q", r.s.all()) }

// TestWatchCoalescesBursts: a burst of writes, each closer to the last than
// the debounce, is one notification, which reads the burst's last content;
// the burst lasts longer than the debounce, so a timer that is not pushed
// back by every write fires inside it (and reads an earlier content). Two
// later writes, each once the previous one was seen, must be one
// notification each: a spurious notice of the burst would show as an extra
// entry before them.
func TestWatchCoalescesBursts(t *testing.T) {
	const (
		debounce = time.Second
		gap      = debounce / 10
		writes   = 15 // 1.4 s of writes
	)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("before")
	// A stalled machine can stretch a gap past the debounce, which ends a
	// burst for a correct watcher too: such a try proves nothing and is
	// run again.
	for try := 1; ; try++ {
		s := watchContents(t, path, debounce)
		tick := time.NewTicker(gap) // paces the writes; no assertion waits on it
		last := time.Now()
		stalled := time.Duration(0)
		for i := range writes {
			if i > 0 {
				<-tick.C
			}
			if d := time.Since(last); d > stalled {
				stalled = d
			}
			last = time.Now()
			write(fmt.Sprintf("try %d write %d", try, i))
		}
		tick.Stop()
		if stalled >= debounce/2 {
			if try == 3 {
				t.Fatalf("three bursts had a gap of %v or more between writes: the machine is too loaded to tell", debounce/2)
			}
			t.Logf("try %d: a gap of %v between two writes; burst again", try, stalled)
			continue
		}
		burstEnd := fmt.Sprintf("try %d write %d", try, writes-1)
		s.waitFor(t, burstEnd)
		write("sentinel 1")
		s.waitFor(t, "sentinel 1")
		write("sentinel 2")
		s.waitFor(t, "sentinel 2")
		if got, want := s.all(), []string{burstEnd, "sentinel 1", "sentinel 2"}; !slices.Equal(got, want) {
			t.Fatalf("notifications read %q, want %q", got, want)
		}
		return
	}
}

// TestWatchSeesRenameAndSymlinkSwap: a Kubernetes ConfigMap swap (a new
// ..data link renamed over the old one) and an editor's save (a file renamed
// over the config) are each seen, and each notification reads the file as
// it is after that step.
func TestWatchSeesRenameAndSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	// Kubernetes layout: kvload.yml -> ..data/kvload.yml, ..data -> ..v1
	v1 := filepath.Join(dir, "..v1")
	v2 := filepath.Join(dir, "..v2")
	for _, d := range []string{v1, v2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "kvload.yml"), []byte(d), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kvload.yml")
	if err := os.Symlink(filepath.Join("..data", "kvload.yml"), path); err != nil {
		t.Fatal(err)
	}
	s := watchContents(t, path, 50*time.Millisecond)

	// The swap: a new link is created, then renamed over ..data. The new
	// link alone is noticed (it might be a swap) and changes nothing; the
	// rename must be noticed on its own.
	if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, v1)
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, v2)

	// An editor's save: a file written elsewhere is renamed over the config.
	tmp := filepath.Join(t.TempDir(), "kvload.yml.new")
	if err := os.WriteFile(tmp, []byte("edited"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, "edited")
	// Repeats are left out: the events of one rename may straddle a
	// debounce on a busy machine, and reading the same bytes twice is
	// harmless (TestWatchCoalescesBursts is the test of coalescing).
	if got, want := slices.Compact(s.all()), []string{v1, v2, "edited"}; !slices.Equal(got, want) {
		t.Errorf("notifications read %q, want %q", got, want)
	}
}
