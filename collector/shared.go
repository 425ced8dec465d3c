package collector

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// SharedGatherer returns a Gatherer whose concurrent calls share one
// gathering of g: a call made while another is under way waits for it and
// returns its result, so a scrape storm costs one gathering at a time
// rather than one per scrape (each allocates a copy of every series). The
// shared result is at most one gathering older than the call; nothing is
// cached beyond it. The metric families are read-only for callers, as
// promhttp treats them.
func SharedGatherer(g prometheus.Gatherer) prometheus.Gatherer {
	return &sharedGatherer{g: g}
}

type sharedGatherer struct {
	g  prometheus.Gatherer
	mu sync.Mutex
	in *gathering // the gathering under way, nil when none

	waiting atomic.Int64 // calls waiting for another's gathering, for tests
}

type gathering struct {
	done chan struct{} // closed when mfs and err are set
	mfs  []*dto.MetricFamily
	err  error
}

func (s *sharedGatherer) Gather() ([]*dto.MetricFamily, error) {
	s.mu.Lock()
	if in := s.in; in != nil {
		s.mu.Unlock()
		s.waiting.Add(1)
		defer s.waiting.Add(-1)
		<-in.done
		return in.mfs, in.err
	}
	in := &gathering{done: make(chan struct{})}
	s.in = in
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.in = nil
		s.mu.Unlock()
		close(in.done)
	}()
	in.mfs, in.err = s.g.Gather()
	return in.mfs, in.err
}
