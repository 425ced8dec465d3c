package lifecycle

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-kit/log"
)

// logBuffer is a log destination safe for concurrent writers and readers.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestOnceEndLogged: a loop: once workload logs one info line naming it and
// its target when its single pass is done and drained; a workload still
// replaying (loop: repeat) logs none.
func TestOnceEndLogged(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	dir := t.TempDir()
	trace := filepath.Join(dir, "now.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [3, 4]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kvload.yml")
	writeConfig(t, path, fmt.Sprintf(`targets:
  - {name: t, url: %s, model: m, dialect: vllm}
workloads:
  - {name: once, trace: %s, targets: [t], block_size: 16, loop: once}
  - {name: forever, trace: %s, targets: [t], block_size: 16, loop: repeat}
`, srv.URL, trace, fixture(t, "future.jsonl")))
	var logs logBuffer
	d, err := startDaemon(t, path, func(o *Options) { o.Logger = log.NewLogfmtLogger(&logs) })
	if err != nil {
		t.Fatal(err)
	}
	const line = `msg="replay finished: its single pass is done and drained"`
	eventually(t, "the end of the once workload logged", func() (bool, string) {
		return strings.Contains(logs.String(), line), logs.String()
	})
	d.stop()
	<-d.Done()
	var ends []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, line) {
			ends = append(ends, l)
		}
	}
	if len(ends) != 1 || !strings.Contains(ends[0], "workload=once") || !strings.Contains(ends[0], "target=t ") ||
		!strings.Contains(ends[0], "level=info") {
		t.Errorf("want one info line for workload once, target t; got %q", ends)
	}
}
