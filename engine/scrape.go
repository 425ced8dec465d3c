package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxMetricsBytes bounds one scrape of a server's /metrics.
const maxMetricsBytes = 32 << 20

// ServerCounts is what one read of an engine's /metrics counted since the
// read before.
type ServerCounts struct {
	Cached float64 // prompt tokens served from its prefix cache
	// Prompt is the prompt tokens it processed, cached or not; only when
	// PromptKnown (the engine exports such a counter).
	Prompt      float64
	PromptKnown bool
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

	last       float64
	lastPrompt float64
	lastStart  float64 // the server's process_start_time_seconds, 0 if it has none
	seen       bool
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

// Run scrapes every Interval until ctx is done. A failed scrape is
// reported through onError and retried at the next tick.
func (s *ServerScraper) Run(ctx context.Context, c CountSink, onError func(error)) {
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

// ScrapeOnce reads the counters once and hands the increase, or why it
// was not credited, to c.
func (s *ServerScraper) ScrapeOnce(ctx context.Context, c CountSink) error {
	r, err := s.read(ctx)
	if err != nil {
		c.ServerMetricsError(s.Target, ServerErrorScrape)
		return err
	}
	counts, err := s.counts(r)
	if bad := (*RejectedCount)(nil); errors.As(err, &bad) {
		c.ServerMetricsError(s.Target, bad.Reason)
		return err
	}
	c.AddServerCounts(s.Target, counts)
	return nil
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
	ServerErrorScrape    ServerMetricsErrorReason = "scrape"
	ServerErrorNotFinite ServerMetricsErrorReason = "not_finite"
	ServerErrorNegative  ServerMetricsErrorReason = "negative"
	ServerErrorTooLarge  ServerMetricsErrorReason = "too_large"
	ServerErrorJump      ServerMetricsErrorReason = "jump"
)

// RejectedCount is a scraped counter value that is not credited, and why.
type RejectedCount struct {
	Target      string
	Reason      ServerMetricsErrorReason // not scrape
	Value, Last float64
}

func (e *RejectedCount) Error() string {
	switch e.Reason {
	case ServerErrorJump:
		return fmt.Sprintf("target %s: server metrics: cached-token counter jumped from %g to %g, more than %d in one scrape: not credited", e.Target, e.Last, e.Value, int64(maxServerIncrease))
	case ServerErrorTooLarge:
		return fmt.Sprintf("target %s: server metrics: cached-token counter %g is above 2^53: not credited", e.Target, e.Value)
	}
	return fmt.Sprintf("target %s: server metrics: cached-token counter %g is %s: not credited", e.Target, e.Value, strings.ReplaceAll(string(e.Reason), "_", " "))
}

// engineRead is one read of a server's counters.
type engineRead struct {
	cached      float64
	prompt      float64 // cached or not; when promptKnown
	promptKnown bool
	start       float64 // process_start_time_seconds, 0 if none
}

// counts turns a read into increases since the read before (see delta). A
// rejected cached-token count leaves both baselines as they were.
func (s *ServerScraper) counts(r engineRead) (ServerCounts, error) {
	var c ServerCounts
	seen, last, lastStart := s.seen, s.last, s.lastStart
	cached, err := s.delta(r.cached, r.start)
	if err != nil {
		return ServerCounts{}, err
	}
	c.Cached = cached
	if r.promptKnown {
		c.PromptKnown = true
		switch {
		case !seen:
		case r.start != lastStart && r.start != 0 && lastStart != 0, r.prompt < s.lastPrompt, r.cached < last:
			// The server restarted: its counters began again.
			c.Prompt = r.prompt
		default:
			c.Prompt = r.prompt - s.lastPrompt
		}
		s.lastPrompt = r.prompt
	}
	return c, nil
}

// delta is the counter's increase since the last scrape. A restarted
// server's counter began again from zero: a new process start time says so
// (even when the new count has already passed the old one), and so does a
// decrease. The first scrape only sets the baseline: what the server
// counted before the exporter started is not ours. An implausible value is
// a *RejectedCount and leaves the baseline as it was, so that a one-off
// glitch costs nothing once the counter reads sane again.
func (s *ServerScraper) delta(v, start float64) (float64, error) {
	reject := func(reason ServerMetricsErrorReason) (float64, error) {
		return 0, &RejectedCount{Target: s.Target, Reason: reason, Value: v, Last: s.last}
	}
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return reject(ServerErrorNotFinite)
	case v < 0:
		return reject(ServerErrorNegative)
	case v > maxServerCount:
		return reject(ServerErrorTooLarge)
	}
	var d float64
	switch {
	case !s.seen:
	case start != s.lastStart && start != 0 && s.lastStart != 0, v < s.last:
		d = v
	default:
		d = v - s.last
	}
	if d > maxServerIncrease {
		return reject(ServerErrorJump)
	}
	s.last, s.lastStart, s.seen = v, start, true
	return d, nil
}

// read returns the server's cached-token count, its prompt-token count
// where it has one, and its process start time.
func (s *ServerScraper) read(ctx context.Context) (engineRead, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return engineRead{}, fmt.Errorf("target %s: server metrics: %w", s.Target, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := s.Client.Do(req)
	if err != nil {
		return engineRead{}, fmt.Errorf("target %s: server metrics: %w", s.Target, err)
	}
	defer resp.Body.Close()
	if err := RedirectError(resp); err != nil {
		return engineRead{}, fmt.Errorf("target %s: server metrics %s: %w", s.Target, req.URL.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		return engineRead{}, fmt.Errorf("target %s: server metrics: HTTP %d", s.Target, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return engineRead{}, fmt.Errorf("target %s: server metrics: %w", s.Target, err)
	}
	var r engineRead
	if r.cached, err = cachedTokens(mfs, s.Dialect, s.Target); err != nil {
		return engineRead{}, err
	}
	if pm := For(s.Dialect).Metrics; len(pm.PromptTokens) > 0 {
		if v, found := sumFirst(mfs, pm.PromptTokens); found {
			r.prompt, r.promptKnown = v, true
			if pm.PromptExcludesCached {
				r.prompt += r.cached
			}
		}
	}
	if mf := mfs["process_start_time_seconds"]; mf != nil && len(mf.GetMetric()) > 0 {
		m := mf.GetMetric()[0]
		r.start = m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return r, nil
}

// cachedTokens sums the dialect's cached-token metric over all its series
// (every model and engine label of the server).
func cachedTokens(mfs map[string]*dto.MetricFamily, dialect Dialect, target string) (float64, error) {
	names := For(dialect).Metrics.CachedTokens
	if v, ok := sumFirst(mfs, names); ok {
		return v, nil
	}
	return 0, fmt.Errorf("target %s: server metrics: none of %v found (is the engine's metrics switch on?)", target, names)
}

// sumFirst sums the first of names present over all its series.
func sumFirst(mfs map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, name := range names {
		mf, ok := mfs[name]
		if !ok {
			// The text parser keys counters by their exposed name, with _total.
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Untyped != nil:
				sum += m.GetUntyped().GetValue()
			case m.Histogram != nil:
				sum += m.GetHistogram().GetSampleSum()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
		return sum, true
	}
	return 0, false
}
