package config

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// watchTest runs Watch on path and returns a channel of notifications.
func watchTest(t *testing.T, path string, debounce time.Duration) <-chan struct{} {
	t.Helper()
	w, err := NewWatcher(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{}, 100)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.Run(ctx, debounce, func() { ch <- struct{}{} })
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return ch
}

// waitNotify fails the test if no notification comes within a generous
// bound; the bound only guards against a hang, it is not a timing claim.
func waitNotify(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no change notification")
	}
}

func TestWatchCoalescesBursts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvload.yml")
	if err := os.WriteFile(path, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The debounce is longer than the whole burst of writes, so the burst
	// must produce exactly one notification.
	ch := watchTest(t, path, 2*time.Second)
	for i := 0; i < 10; i++ {
		if err := os.WriteFile(path, []byte{byte('b' + i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	waitNotify(t, ch)
	// A second notification from the burst would come a debounce after
	// its last write. A sentinel write made now is notified a debounce
	// later too, so whatever arrives first tells: the sentinel's
	// notification, which sees the sentinel, or a second one of the burst,
	// which may come before the sentinel is even written.
	sentinel := filepath.Join(dir, "sentinel")
	if err := os.WriteFile(path, []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	seen := make(chan bool, 1)
	go func() {
		<-ch
		_, err := os.Stat(sentinel)
		seen <- err == nil
	}()
	if err := os.WriteFile(sentinel, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-seen:
		if !ok {
			t.Fatal("a burst of ten writes gave two notifications")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification of the sentinel write")
	}
}

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
	ch := watchTest(t, path, 10*time.Millisecond)

	// The swap: a new link is created and renamed over ..data atomically.
	if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, ch) // the new link itself; the rename below must be seen on its own
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, ch)
	if got, _ := os.ReadFile(path); string(got) != v2 {
		t.Fatalf("after the swap the file reads %q", got)
	}

	// An editor's save: a file written elsewhere is renamed over the config.
	tmp := filepath.Join(t.TempDir(), "kvload.yml.new")
	if err := os.WriteFile(tmp, []byte("edited"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, ch)
}
