package collector

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// SLO is what a (workload, target)'s requests are judged against: a
// request is good when it succeeded and met every threshold given (0 is
// not judged).
type SLO struct {
	TTFT       time.Duration // time to first token
	InterToken time.Duration // the request's mean inter-token latency
	Request    time.Duration // send to last token
	Objective  float64       // share of judged requests that must be good
}

// SLOThreshold names a threshold of an SLO: the threshold label of
// kvload_slo_threshold_seconds.
type SLOThreshold string

// The thresholds of an SLO.
const (
	SLOThresholdTTFT       SLOThreshold = "ttft"
	SLOThresholdInterToken SLOThreshold = "inter_token"
	SLOThresholdRequest    SLOThreshold = "request"
)

// Good tells whether r meets the objective's thresholds: it succeeded,
// and each latency given is within its bound. A request with fewer than
// two output tokens has no inter-token latency, and so cannot miss it.
func (s SLO) Good(r *replay.Result) bool {
	if r.Outcome != openai.OutcomeSuccess {
		return false
	}
	if s.TTFT > 0 {
		if d, ok := r.TTFT(); !ok || d > s.TTFT {
			return false
		}
	}
	if s.InterToken > 0 {
		if d, ok := r.ITL(); ok && d > s.InterToken {
			return false
		}
	}
	if s.Request > 0 {
		if d, ok := r.Latency(); !ok || d > s.Request {
			return false
		}
	}
	return true
}

// judged tells whether a request with outcome o counts for an SLO: one
// the exporter itself ended (a reload's cancellation, an abandoned
// stream) says nothing of the target.
func judged(o openai.Outcome) bool {
	return o == openai.OutcomeSuccess || o.IsError()
}

// SLOs is the collector's part for the service-level objectives of each
// (workload, target): the requests judged, the good ones, and the
// thresholds and objective the rules divide by.
type SLOs struct {
	judged     *prometheus.CounterVec
	good       *prometheus.CounterVec
	objective  *prometheus.GaugeVec
	thresholds *prometheus.GaugeVec

	mu   sync.RWMutex
	byWT map[wtKey]SLO // one per configured (workload, target) with an SLO
}

func newSLOs() *SLOs {
	wt := []string{"workload", "target"}
	return &SLOs{
		judged: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "slo_requests_total",
			Help: "Finished requests judged against the workload's SLO: every outcome but canceled and abandoned."}, wt),
		good: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "slo_good_requests_total",
			Help: "Judged requests that succeeded and met every threshold of the workload's SLO."}, wt),
		objective: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "slo_objective_ratio",
			Help: "The share of judged requests the workload's SLO wants good (slo.objective); its error budget is 1 minus this."}, wt),
		thresholds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "slo_threshold_seconds",
			Help: "The latency bounds of the workload's SLO, by threshold: ttft, inter_token (the request's mean), request (end to end); absent when not given."},
			append(wt, "threshold")),
		byWT: map[wtKey]SLO{},
	}
}

func (s *SLOs) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.judged, s.good, s.objective, s.thresholds}
}

// Set makes slo the objective of a (workload, target) from now on, with
// its counters at zero and its gauges published; nil removes it and its
// series.
func (s *SLOs) Set(workload, target string, slo *SLO) {
	s.forget(prometheus.Labels{"workload": workload, "target": target})
	if slo == nil {
		return
	}
	s.mu.Lock()
	s.byWT[wtKey{workload, target}] = *slo
	s.mu.Unlock()
	s.judged.WithLabelValues(workload, target)
	s.good.WithLabelValues(workload, target)
	s.objective.WithLabelValues(workload, target).Set(slo.Objective)
	for _, th := range []struct {
		name SLOThreshold
		d    time.Duration
	}{{SLOThresholdTTFT, slo.TTFT}, {SLOThresholdInterToken, slo.InterToken}, {SLOThresholdRequest, slo.Request}} {
		if th.d > 0 {
			s.thresholds.WithLabelValues(workload, target, string(th.name)).Set(th.d.Seconds())
		}
	}
}

// forget deletes the series and the objective of the pairs l matches.
func (s *SLOs) forget(l prometheus.Labels) {
	s.mu.Lock()
	for k := range s.byWT {
		if (l["workload"] == "" || l["workload"] == k.workload) && (l["target"] == "" || l["target"] == k.target) {
			delete(s.byWT, k)
		}
	}
	s.mu.Unlock()
	for _, v := range []*prometheus.CounterVec{s.judged, s.good} {
		v.DeletePartialMatch(l)
	}
	for _, v := range []*prometheus.GaugeVec{s.objective, s.thresholds} {
		v.DeletePartialMatch(l)
	}
}

// observe judges a finished request, when its pair has an objective.
func (s *SLOs) observe(r *replay.Result) {
	if !judged(r.Outcome) {
		return
	}
	s.mu.RLock()
	slo, ok := s.byWT[wtKey{r.Workload, r.Target}]
	s.mu.RUnlock()
	if !ok {
		return
	}
	s.judged.WithLabelValues(r.Workload, r.Target).Inc()
	if slo.Good(r) {
		s.good.WithLabelValues(r.Workload, r.Target).Inc()
	}
}
