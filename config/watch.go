package config

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kvload-exporter/kvload-exporter/replay"
)

// Watcher reports changes to a configuration file. It watches the file's
// directory, not the file: editors replace files by renaming, and Kubernetes
// swaps ConfigMap contents by re-pointing a symlink, and a watch on the file
// itself loses both.
type Watcher struct {
	w    *fsnotify.Watcher
	name string // the file's base name
}

// NewWatcher starts watching the directory of path; changes made after it
// returns are seen.
func NewWatcher(path string) (*Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watching directory %s: %w", dir, err)
	}
	return &Watcher{w: w, name: filepath.Base(path)}, nil
}

// concerns tells whether an event on name may change the file: the file
// itself, or Kubernetes' "..data" links and "..TIMESTAMP" directories.
// Other files of the directory (logs, traces) are ignored.
func (w *Watcher) concerns(name string) bool {
	base := filepath.Base(name)
	return base == w.name || strings.HasPrefix(base, "..")
}

// Run calls changed after each burst of changes has been quiet for
// debounce, measured on timer (stopped; nil is the runtime's timer, a
// test passes a fake clock's, which then says when the quiet has lasted).
// It may call changed when the file's content did not change; the caller
// compares contents. Run closes the watcher and returns when ctx is done.
func (w *Watcher) Run(ctx context.Context, debounce time.Duration, timer replay.DispatchTimer, changed func()) {
	if timer == nil {
		timer = replay.NewRuntimeTimer()
	}
	defer w.w.Close()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			if ev.Op == fsnotify.Chmod || !w.concerns(ev.Name) {
				continue
			}
			timer.Reset(debounce)
		case _, ok := <-w.w.Errors:
			if !ok {
				return
			}
			// An error such as a queue overflow may have lost events: treat
			// it as a change, the content check downstream sorts it out.
			timer.Reset(debounce)
		case <-timer.C():
			changed()
		}
	}
}
