package config

import (
	"math"
	"time"

	"github.com/prometheus/common/model"
)

// SLO is a workload's service-level objective: a request is good when it
// succeeded and met every threshold given (0 is not judged).
type SLO struct {
	// TTFT bounds the time to first token.
	TTFT Duration `yaml:"ttft,omitempty"`
	// InterToken bounds the request's mean inter-token latency.
	InterToken Duration `yaml:"inter_token,omitempty"`
	// Request bounds the time from send to the last token.
	Request Duration `yaml:"request,omitempty"`
	// Objective is the share of judged requests that must be good, for
	// example 0.99; the error budget is 1 - Objective.
	Objective float64 `yaml:"objective"`
}

// Abandon makes a workload close the stream of a seeded share of its
// requests early, as a user pressing stop or a client timing out does.
type Abandon struct {
	// Share is the fraction of requests abandoned, drawn from the
	// workload's seed.
	Share float64 `yaml:"share"`
	// AfterTokens closes the stream once this many content chunks arrived.
	AfterTokens int `yaml:"after_tokens,omitempty"`
	// After closes the stream this long after the request was sent.
	After Duration `yaml:"after,omitempty"`
}

// Bounds of the SLO thresholds and abandonment: a threshold above a day is
// no objective a canary can keep, and a request longer than that is
// beyond any request_timeout worth setting.
const (
	MaxSLOThreshold    = Duration(24 * time.Hour)
	MaxAbandonAfter    = Duration(24 * time.Hour)
	MaxAbandonAfterTok = 1 << 20
)

func validateSLO(s *SLO, p string, bad func(string, string, ...any)) {
	if s == nil {
		return
	}
	if !(s.Objective > 0 && s.Objective < 1) {
		bad(p+".objective", "must be above 0 and below 1 (for example 0.99), got %v", s.Objective)
	}
	for _, th := range []struct {
		key string
		d   Duration
	}{{"ttft", s.TTFT}, {"inter_token", s.InterToken}, {"request", s.Request}} {
		if th.d > MaxSLOThreshold {
			bad(p+"."+th.key, "must be from 0 (not judged) to %v, got %v", model.Duration(MaxSLOThreshold), model.Duration(th.d))
		}
	}
}

func validateAbandon(a *Abandon, p string, bad func(string, string, ...any)) {
	if a == nil {
		return
	}
	if !(a.Share > 0 && a.Share <= 1) || math.IsNaN(a.Share) {
		bad(p+".share", "must be above 0 and at most 1, got %v", a.Share)
	}
	switch {
	case a.AfterTokens != 0 && a.After != 0:
		bad(p, "after_tokens and after exclude each other")
	case a.AfterTokens == 0 && a.After == 0:
		bad(p, "after_tokens or after is required")
	case a.AfterTokens < 0 || a.AfterTokens > MaxAbandonAfterTok:
		bad(p+".after_tokens", "must be from 1 to %d, got %d", MaxAbandonAfterTok, a.AfterTokens)
	case a.After > MaxAbandonAfter:
		bad(p+".after", "must be at most %v, got %v", model.Duration(MaxAbandonAfter), model.Duration(a.After))
	}
}
