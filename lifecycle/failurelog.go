package lifecycle

import (
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// failureLogInterval is the least time between two "requests failing" lines
// of one (workload, target): a dead endpoint fails every request, and the
// counts are in the metrics; the log only has to say what is going on.
const failureLogInterval = 30 * time.Second

// failureLog turns failed requests into rate-limited log lines naming the
// workload, the target, the outcomes and the last error, and says once when
// requests succeed again.
type failureLog struct {
	logger   log.Logger
	interval time.Duration
	now      func() time.Time

	mu       sync.Mutex
	counts   map[openai.Outcome]int // failures since the last line
	lastErr  string
	lastLine time.Time // zero: nothing logged in this failure streak yet
	failing  bool      // a "requests failing" line went out and no success followed
}

func newFailureLog(logger log.Logger) *failureLog {
	return &failureLog{logger: logger, interval: failureLogInterval, now: time.Now, counts: map[openai.Outcome]int{}}
}

// observe records one request's outcome.
func (f *failureLog) observe(r *replay.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Outcome == openai.OutcomeAbandoned {
		return // closed on purpose: neither a failure nor a recovery
	}
	now := f.now()
	if r.Outcome == openai.OutcomeSuccess {
		if f.failing {
			f.flushLocked(now, "requests failed before recovering")
			level.Info(f.logger).Log("msg", "requests succeed again")
			f.failing = false
			f.lastLine = time.Time{}
		}
		return
	}
	f.counts[r.Outcome]++
	f.lastErr = r.Error
	if f.lastLine.IsZero() || now.Sub(f.lastLine) >= f.interval {
		f.flushLocked(now, "requests failing")
		f.failing = true
	}
}

// flushLocked logs the failures counted since the last line, if any.
func (f *failureLog) flushLocked(now time.Time, msg string) {
	if len(f.counts) == 0 {
		return
	}
	outcomes := make([]string, 0, len(f.counts))
	total := 0
	for o, n := range f.counts {
		outcomes = append(outcomes, string(o)+"="+strconv.Itoa(n))
		total += n
	}
	sort.Strings(outcomes)
	kv := []any{"msg", msg, "failed", total, "outcomes", strings.Join(outcomes, ","), "last_error", f.lastErr}
	if !f.lastLine.IsZero() {
		kv = append(kv, "since", now.Sub(f.lastLine).Round(time.Second).String())
	}
	level.Warn(f.logger).Log(kv...)
	clear(f.counts)
	f.lastLine = now
}
