package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// ServerCounts is what one read of an engine's /metrics counted since the
// read before.
type ServerCounts struct {
	Cached float64 // prompt tokens served from its prefix cache
	// Prompt is the prompt tokens it processed, cached or not; only when
	// PromptKnown (the engine exports such a counter).
	Prompt      float64
	PromptKnown bool
	// Recomputed is the tokens it found in its cache and computed again,
	// left out of Cached; only when RecomputedKnown (the engine exports
	// such a counter).
	Recomputed      float64
	RecomputedKnown bool
	// Baseline: the scraper's first read, which only takes the counters'
	// values; nothing counted before it is known.
	Baseline bool
	// Restarted: the engine restarted since the read before (a new
	// process start time). Cached and Prompt are then its counts since,
	// and what it counted between the read before and its end is lost.
	Restarted bool
	// SeriesBegan: a series of a counter went back and is counted from
	// zero again, which an engine that exports no start time does when it
	// restarts. Like Restarted, it tells the reads before from this one.
	SeriesBegan bool
	// At is when the read was asked for: the page counts what the engine
	// did until a moment later.
	At time.Time
}

// CountSink takes what a ServerScraper reads: the collector.
type CountSink interface {
	AddServerCounts(target string, c ServerCounts)
	ServerMetricsError(target string, reason ServerMetricsErrorReason)
}

// ServerScraper reads a target's cached-token counter from its /metrics and
// feeds the increase to the collector (observed: server_metrics).
type ServerScraper struct {
	Target   string
	URL      string
	Dialect  Dialect
	Client   *http.Client
	Interval time.Duration
	// Timeout bounds each scrape of Run, from the request to the parsed
	// page; HeaderTimeout bounds the wait for the answer's head within it.
	// Zero: only the context passed bounds a scrape.
	Timeout, HeaderTimeout time.Duration
	// FirstAfter delays Run's first read (0: at once), so that scrapers
	// started together, whose baseline nothing waits for, do not all read
	// at the same moment as the load's other reads.
	FirstAfter time.Duration

	cached, prompt, recomputed counterBaseline
	lastStart                  float64 // the server's process_start_time_seconds, 0 if it has none
	seen                       bool
}

// Prime takes the counter's baseline now, so that what the server counted
// before this exporter sent anything is not credited to it. Call it before
// the first request goes out; Run then goes on from there.
func (s *ServerScraper) Prime(ctx context.Context) error {
	r, err := s.read(ctx)
	if err != nil {
		return err
	}
	_, err = s.counts(r)
	return err
}

// Run scrapes every Interval until ctx is done, then closes the client's
// idle connections: a stopped scraper leaves none behind. A failed scrape
// is reported through onError and retried at the next tick; with Timeout
// below Interval, a target that hangs delays no tick.
func (s *ServerScraper) Run(ctx context.Context, c CountSink, onError func(error)) {
	defer s.Client.CloseIdleConnections()
	if !sleep(ctx, s.FirstAfter) {
		return
	}
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		if err := s.ScrapeOnce(ctx, c); err != nil && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sleep waits d, or less when ctx ends first: then it returns false.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ScrapeOnce reads the counters once, within Timeout, and hands the
// increase, or why it was not credited, to c. A scrape cut short because
// ctx ended (the scraper stopped) is not counted: it says nothing of the
// target, whose series may be gone by then.
func (s *ServerScraper) ScrapeOnce(ctx context.Context, c CountSink) error {
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if s.Timeout > 0 {
		sctx, cancel = context.WithTimeoutCause(ctx, s.Timeout, fmt.Errorf("no whole page within %v: %w", s.Timeout, context.DeadlineExceeded))
	}
	defer cancel()
	at := time.Now()
	r, err := s.read(sctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		c.ServerMetricsError(s.Target, readFailure(err))
		return err
	}
	counts, err := s.counts(r)
	if bad := (*RejectedCount)(nil); errors.As(err, &bad) {
		c.ServerMetricsError(s.Target, bad.Reason)
		return err
	}
	counts.At = at
	c.AddServerCounts(s.Target, counts)
	return nil
}

// readFailure is the reason a failed read is counted under.
func readFailure(err error) ServerMetricsErrorReason {
	if ne := net.Error(nil); errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return ServerErrorTimeout
	}
	if errors.Is(err, ErrDuplicateSeries) {
		return ServerErrorDuplicate
	}
	return ServerErrorScrape
}

// Bounds of a plausible cached-token counter. Above maxServerCount a
// float64 no longer holds every whole number; maxServerIncrease per scrape
// would be 200 billion tokens a second at a 5 s interval, far beyond any
// engine. A counter past them is broken, and crediting it would ruin every
// rate on the dashboard.
const (
	maxServerCount    = 1 << 53
	maxServerIncrease = 1 << 40
)

// ServerMetricsErrorReason is why a scrape of a target's cached-token
// counter was not credited: the reason label of
// kvload_server_metrics_errors_total.
type ServerMetricsErrorReason string

// The reasons: the scrape failed, or its value is implausible.
const (
	ServerErrorScrape ServerMetricsErrorReason = "scrape"
	// ServerErrorTimeout: no whole page within the scrape's timeout (a
	// target that hangs, or drips its answer).
	ServerErrorTimeout ServerMetricsErrorReason = "timeout"
	// ServerErrorDuplicate: the page holds a series of a counter read
	// twice.
	ServerErrorDuplicate ServerMetricsErrorReason = "duplicate"
	ServerErrorNotFinite ServerMetricsErrorReason = "not_finite"
	ServerErrorNegative  ServerMetricsErrorReason = "negative"
	ServerErrorTooLarge  ServerMetricsErrorReason = "too_large"
	ServerErrorJump      ServerMetricsErrorReason = "jump"
	// ServerErrorBackwards: a series went down while the engine's process
	// start time, known, stayed the same: no restart explains it (another
	// replica's page behind one address, a counter reset by hand).
	ServerErrorBackwards ServerMetricsErrorReason = "backwards"
)

// RejectedCount is a scraped counter value that is not credited, and why.
type RejectedCount struct {
	Target string
	// Counter is the counter refused: the cached-token one, or the
	// prompt-token one.
	Counter CounterKind
	Reason  ServerMetricsErrorReason // a value's: not scrape, timeout or duplicate
	// Value is the offending series' value; for a jump, the counter's sum
	// over its series, and Last the sum the same series had before.
	Value, Last float64
}

func (e *RejectedCount) Error() string {
	switch e.Reason {
	case ServerErrorJump:
		return fmt.Sprintf("target %s: server metrics: %s counter jumped from %g to %g, more than %d in one scrape: not credited", e.Target, e.Counter, e.Last, e.Value, int64(maxServerIncrease))
	case ServerErrorTooLarge:
		return fmt.Sprintf("target %s: server metrics: %s counter %g is above 2^53: not credited", e.Target, e.Counter, e.Value)
	case ServerErrorBackwards:
		return fmt.Sprintf("target %s: server metrics: %s counter went back from %g to %g with no restart of the engine: not credited, counted from there", e.Target, e.Counter, e.Last, e.Value)
	}
	return fmt.Sprintf("target %s: server metrics: %s counter %g is %s: not credited", e.Target, e.Counter, e.Value, strings.ReplaceAll(string(e.Reason), "_", " "))
}

// CounterKind names an engine counter the scraper reads.
type CounterKind string

// The counters read.
const (
	CachedCounter     CounterKind = "cached-token"
	PromptCounter     CounterKind = "prompt-token"
	RecomputedCounter CounterKind = "recomputed-token"
)

// seriesValues is one read of a counter: each series' value, by label set
// (seriesKey).
type seriesValues map[string]float64

// engineRead is one read of a server's counters.
type engineRead struct {
	// The counters' values; prompt (cached or not) and recomputed are nil
	// where the engine has no such counter.
	cached, prompt, recomputed seriesValues
	cachedFrom                 Series  // the cached-token counter read
	start                      float64 // process_start_time_seconds, 0 if none
}

// counterValues are a read's counters, each with its kind, its values
// and the baseline of the reads before.
func (s *ServerScraper) counterValues(r engineRead) []counterRead {
	return []counterRead{{CachedCounter, r.cached, &s.cached}, {PromptCounter, r.prompt, &s.prompt}, {RecomputedCounter, r.recomputed, &s.recomputed}}
}

// counterRead is one counter of a read.
type counterRead struct {
	kind CounterKind
	now  seriesValues // nil: not exported
	last *counterBaseline
}

// counts turns a read into increases since the read before, series by
// series (see counterBaseline.advance). The server restarted when its
// process start time changed: then every series began again from zero,
// even one whose new count has already passed the old. Every counter is
// held to the same rules: an implausible value or jump of any leaves
// every baseline as it was, so that a one-off glitch costs nothing once
// the counter reads sane again. A series that went back while the start
// time, known, stayed the same is refused too, and the counts go on from
// the values read, which no later read could otherwise pass.
func (s *ServerScraper) counts(r engineRead) (ServerCounts, error) {
	restarted := s.seen && r.start != s.lastStart && r.start != 0 && s.lastStart != 0
	counters := s.counterValues(r)
	for _, c := range counters {
		for _, v := range c.now {
			if err := s.plausible(c.kind, v); err != nil {
				return ServerCounts{}, err
			}
		}
	}
	var inc [3]float64
	var next [3]counterBaseline
	began := false
	for i, c := range counters {
		if c.now == nil {
			continue
		}
		var b bool
		inc[i], next[i], b = c.last.advance(c.now, restarted)
		began = began || b
		if inc[i] > maxServerIncrease {
			return ServerCounts{}, &RejectedCount{Target: s.Target, Counter: c.kind, Reason: ServerErrorJump, Value: c.now.sum(), Last: c.last.sumOf(c.now)}
		}
	}
	c := ServerCounts{Cached: inc[0], Baseline: !s.seen, Restarted: restarted, SeriesBegan: began}
	if r.recomputed != nil {
		c.Recomputed, c.RecomputedKnown = inc[2], true
		if r.cachedFrom.CountsRecomputed {
			c.Cached = max(c.Cached-c.Recomputed, 0)
		}
	}
	if r.prompt != nil {
		c.Prompt, c.PromptKnown = inc[1], true
		if For(s.Dialect).Metrics.PromptExcludesCached {
			c.Prompt += c.Cached
		}
	}
	var back error
	if s.seen && r.start != 0 && r.start == s.lastStart {
		back = s.wentBack(counters)
	}
	for i, c := range counters {
		if c.now != nil || i == 0 {
			*c.last = next[i]
		}
	}
	s.lastStart, s.seen = r.start, true
	if back != nil {
		return ServerCounts{}, back
	}
	return c, nil
}

// wentBack is the refusal of a read in which a series of any counter is
// below its last value, or nil.
func (s *ServerScraper) wentBack(counters []counterRead) error {
	for _, c := range counters {
		for k, v := range c.now {
			if last, ok := (*c.last)[k]; ok && v < last.v {
				return &RejectedCount{Target: s.Target, Counter: c.kind, Reason: ServerErrorBackwards, Value: c.now.sum(), Last: c.last.sumOf(c.now)}
			}
		}
	}
	return nil
}

// plausible checks one series' value of a counter.
func (s *ServerScraper) plausible(kind CounterKind, v float64) error {
	reject := func(reason ServerMetricsErrorReason) error {
		return &RejectedCount{Target: s.Target, Counter: kind, Reason: reason, Value: v}
	}
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return reject(ServerErrorNotFinite)
	case v < 0:
		return reject(ServerErrorNegative)
	case v > maxServerCount:
		return reject(ServerErrorTooLarge)
	}
	return nil
}

// How long a series that is missing from the page is remembered, and how
// many such series at most: a series that comes back within the window is
// credited what it gained meanwhile; one forgotten comes back as new,
// which credits nothing (never too much).
const (
	maxMissedReads  = 60 // 5 minutes at the 5 s interval
	maxMissedSeries = 1024
)

// counterBaseline is what the reads so far said of a counter's series.
type counterBaseline map[string]lastValue

type lastValue struct {
	v      float64
	missed int // reads in a row the series was missing from
}

// advance is the counter's increase from b to now, and the baseline after
// now. Each series counts on its own: its increase since it was last
// seen; its new value after a decrease (that series began again, and no
// other did); nothing for a series not seen before, whose count so far is
// its baseline, unless the server restarted, when every series began again
// from zero. A series missing from now is kept for a while, so that its
// return credits only what it gained. The first read (b nil) credits
// nothing. began says a series went back.
func (b counterBaseline) advance(now seriesValues, restarted bool) (inc float64, next counterBaseline, began bool) {
	next = make(counterBaseline, len(now))
	for k, v := range now {
		last, ok := b[k]
		switch {
		case restarted:
			inc += v
		case !ok:
		case v < last.v:
			inc += v
			began = true
		default:
			inc += v - last.v
		}
		next[k] = lastValue{v: v}
	}
	if restarted {
		return inc, next, began
	}
	missing := 0
	for k, last := range b {
		if _, ok := now[k]; ok || last.missed >= maxMissedReads || missing >= maxMissedSeries {
			continue
		}
		next[k] = lastValue{v: last.v, missed: last.missed + 1}
		missing++
	}
	return inc, next, began
}

// sumOf is the sum of the last values of now's series, for messages.
func (b counterBaseline) sumOf(now seriesValues) float64 {
	var sum float64
	for k := range now {
		sum += b[k].v
	}
	return sum
}

func (v seriesValues) sum() float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum
}

// families are the families a read of the dialect's counters parses.
func (s *ServerScraper) families() []string {
	m := For(s.Dialect).Metrics
	var names []string
	add := func(list []Series) {
		for _, c := range list {
			if !slices.Contains(names, c.Family) {
				names = append(names, c.Family)
			}
		}
	}
	for _, c := range m.CachedTokens {
		add([]Series{c})
		add(c.PromptTokens)
	}
	add(m.PromptTokens)
	add(m.RecomputedTokens)
	return append(names, "process_start_time_seconds")
}

// read returns the server's cached-token counter, its prompt-token and
// recomputed-token counters where it has them, and its process start
// time. The prompt-token counter is the one counted with the cached one
// read, where the spec pairs them.
func (s *ServerScraper) read(ctx context.Context) (engineRead, error) {
	mfs, err := metricsRead{client: s.Client, url: s.URL, families: s.families(), headerTimeout: s.HeaderTimeout}.read(ctx)
	if err != nil {
		return engineRead{}, fmt.Errorf("target %s: server metrics: %w", s.Target, err)
	}
	var r engineRead
	m := For(s.Dialect).Metrics
	var found bool
	if r.cachedFrom, r.cached, found = firstPresent(mfs, m.CachedTokens); !found {
		return engineRead{}, fmt.Errorf("target %s: server metrics: none of %v found (is the engine's metrics switch on?)", s.Target, m.CachedTokens)
	}
	prompt := m.PromptTokens
	if r.cachedFrom.PromptTokens != nil {
		prompt = r.cachedFrom.PromptTokens
	}
	_, r.prompt, _ = firstPresent(mfs, prompt)
	_, r.recomputed, _ = firstPresent(mfs, m.RecomputedTokens)
	if mf := mfs["process_start_time_seconds"]; mf != nil && len(mf.GetMetric()) > 0 {
		m := mf.GetMetric()[0]
		r.start = m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return r, nil
}

// firstPresent is the first of counters the page holds a series of, and
// the values of its series (the text parser keys a counter by its exposed
// name, with _total); a histogram counts by its sum. A series is keyed by
// its family and labels, so that the values of one counter are never
// taken as another's.
func firstPresent(mfs map[string]*dto.MetricFamily, counters []Series) (Series, seriesValues, bool) {
	for _, c := range counters {
		mf, ok := mfs[c.Family]
		if !ok {
			continue
		}
		v := make(seriesValues, len(mf.GetMetric()))
		for _, m := range mf.GetMetric() {
			if !c.matches(m) {
				continue
			}
			var x float64
			switch {
			case m.Counter != nil:
				x = m.GetCounter().GetValue()
			case m.Untyped != nil:
				x = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				x = m.GetHistogram().GetSampleSum()
			case m.Gauge != nil:
				x = m.GetGauge().GetValue()
			}
			v[c.Family+"\xfd"+seriesKey(m)] = x
		}
		if len(v) > 0 {
			return c, v, true
		}
	}
	return Series{}, nil, false
}
