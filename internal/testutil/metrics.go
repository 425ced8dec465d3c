package testutil

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one reading of a set of metrics, by metric name.
type Families map[string]*dto.MetricFamily

// ParseMetrics reads the Prometheus text format.
func ParseMetrics(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return Families(mfs), nil
}

// Scrape fetches base/metrics (base is a server's root URL, without the
// trailing slash) and parses it; any failure fails the test.
func Scrape(t testing.TB, base string) Families {
	t.Helper()
	mfs, err := TryScrape(base)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// TryScrape is Scrape for a server that may be gone or not up yet: the
// failure is returned, not fatal.
func TryScrape(base string) (Families, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// Gather reads the metrics of g (a registry, in process).
func Gather(t testing.TB, g prometheus.Gatherer) Families {
	t.Helper()
	list, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	mfs := Families{}
	for _, mf := range list {
		mfs[mf.GetName()] = mf
	}
	return mfs
}

// Value sums the series of name whose labels include the given pairs
// (label, value, label, value, ...); a histogram or summary contributes its
// sample count. n is how many series matched: 0 when the family is absent.
func (mfs Families) Value(name string, pairs ...string) (sum float64, n int) {
	for _, m := range mfs[name].GetMetric() {
		if !hasLabels(m, pairs) {
			continue
		}
		n++
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Summary != nil:
			sum += float64(m.GetSummary().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, n
}

// Sum is Value without the count of series.
func (mfs Families) Sum(name string, pairs ...string) float64 {
	sum, _ := mfs.Value(name, pairs...)
	return sum
}

// hasLabels tells whether m carries every label=value of pairs.
func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] {
				found = l.GetValue() == pairs[i+1]
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// SeriesWith lists "name[labels]" of every series carrying label=value,
// sorted.
func (mfs Families) SeriesWith(label, value string) []string {
	var out []string
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if hasLabels(m, []string{label, value}) {
				out = append(out, fmt.Sprintf("%s%v", name, m.GetLabel()))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Gatherer serves the reading as a registry would, sorted by name, for
// client_golang's testutil (GatherAndCompare, GatherAndLint).
func (mfs Families) Gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		out := make([]*dto.MetricFamily, 0, len(mfs))
		for _, mf := range mfs {
			out = append(out, mf)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
		return out, nil
	})
}
