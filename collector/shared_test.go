package collector

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// countingGatherer blocks each gathering until release is closed (nil:
// does not block) and counts them.
type countingGatherer struct {
	started chan struct{}
	release chan struct{}
	calls   atomic.Int64
	err     error
}

func (g *countingGatherer) Gather() ([]*dto.MetricFamily, error) {
	n := g.calls.Add(1)
	if g.started != nil && n == 1 {
		close(g.started)
	}
	if g.release != nil {
		<-g.release
	}
	name := "m"
	return []*dto.MetricFamily{{Name: &name}}, g.err
}

// TestSharedGatherer: calls made while a gathering is under way share it,
// result and error alike; a call after it has ended gathers anew.
func TestSharedGatherer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		callers int
		err     error
	}{
		{"one caller", 1, nil},
		{"storm", 100, nil},
		{"storm with an error", 100, errors.New("collect failed")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &countingGatherer{started: make(chan struct{}), release: make(chan struct{}), err: tc.err}
			s := SharedGatherer(g)
			type answer struct {
				mfs []*dto.MetricFamily
				err error
			}
			answers := make(chan answer, tc.callers)
			first := make(chan struct{})
			go func() { // the gathering the others join
				mfs, err := s.Gather()
				answers <- answer{mfs, err}
				close(first)
			}()
			<-g.started
			var joined sync.WaitGroup
			for range tc.callers - 1 {
				joined.Go(func() {
					mfs, err := s.Gather()
					answers <- answer{mfs, err}
				})
			}
			// Release the gathering only once every joiner waits for it.
			for s.(*sharedGatherer).waiting.Load() != int64(tc.callers-1) {
				runtime.Gosched()
			}
			close(g.release)
			joined.Wait()
			<-first
			close(answers)
			n := 0
			for a := range answers {
				n++
				if len(a.mfs) != 1 || a.mfs[0].GetName() != "m" || !errors.Is(a.err, tc.err) {
					t.Errorf("answer %v, %v; want the shared gathering's", a.mfs, a.err)
				}
			}
			if n != tc.callers {
				t.Errorf("%d answers, want %d", n, tc.callers)
			}
			if c := g.calls.Load(); c != 1 {
				t.Errorf("%d gatherings for %d concurrent callers, want 1", c, tc.callers)
			}
			before := g.calls.Load()
			if _, err := s.Gather(); !errors.Is(err, tc.err) {
				t.Errorf("later call: %v", err)
			}
			if g.calls.Load() != before+1 {
				t.Error("a call after the gathering ended did not gather anew")
			}
		})
	}
}

var _ prometheus.Gatherer = SharedGatherer(prometheus.NewRegistry())
