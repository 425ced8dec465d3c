package dashtest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/teststorage"
)

// Time-compressed rule evaluation: the exporter's /metrics is scraped every
// real second and each scrape is stored at i × compression seconds (i the
// scrape index), so that rule time runs as fast as the replayed trace.
// The rule files are then evaluated over the stored span with the
// Prometheus rule engine, group by group in order, as promtool's rule unit
// tests do, and each alert's state is recorded per step.

// recorder scrapes one exporter into an in-memory TSDB.
type recorder struct {
	db          *teststorage.TestStorage
	url         string // the exporter's /metrics
	instance    string
	compression float64 // rule seconds per real second
	scrapes     int
	client      *http.Client
	// tape, when set, keeps every scrape's kvload_ samples (writeTape), so
	// that the rules can be evaluated again over the same recording.
	tape *tapeWriter
}

func newRecorder(t *testing.T, addr string, compression float64) *recorder {
	t.Helper()
	db, err := teststorage.NewWithError()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &recorder{
		db: db, url: "http://" + addr + "/metrics", instance: addr, compression: compression,
		client: &http.Client{Timeout: 5 * time.Second},
	}
}

// ruleTime is the rule time of scrape i, from the first scrape.
func (r *recorder) ruleTime(i int) time.Duration {
	return time.Duration(float64(i) * r.compression * float64(time.Second))
}

// scrape fetches /metrics once (text format, so histograms arrive as their
// classic _bucket/_sum/_count series) and stores every sample at rule time
// i × compression (i this scrape's index), with the job and instance labels
// a Prometheus scrape adds.
func (r *recorder) scrape(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %d: %w", r.scrapes, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("scrape %d: %w", r.scrapes, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape %d: %s", r.scrapes, resp.Status)
	}
	if r.tape != nil {
		if err := r.tape.scrape(body); err != nil {
			return fmt.Errorf("scrape %d: %w", r.scrapes, err)
		}
	}
	return r.store(ctx, body)
}

// store stores one scrape's body at the rule time of the next index.
func (r *recorder) store(ctx context.Context, body []byte) error {
	ts := ruleEpoch.Add(r.ruleTime(r.scrapes)).UnixMilli()
	app := r.db.Appender(ctx)
	p := textparse.NewPromParser(body, labels.NewSymbolTable(), false)
	var lset labels.Labels
	for {
		e, err := p.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			_ = app.Rollback()
			return fmt.Errorf("scrape %d: parse: %w", r.scrapes, err)
		}
		if e != textparse.EntrySeries {
			continue
		}
		_, _, v := p.Series()
		p.Labels(&lset)
		b := labels.NewBuilder(lset)
		b.Set("job", "kvload")
		b.Set("instance", r.instance)
		if _, err := app.Append(0, b.Labels(), ts, v); err != nil {
			_ = app.Rollback()
			return fmt.Errorf("scrape %d: append %s: %w", r.scrapes, lset, err)
		}
	}
	if err := app.Commit(); err != nil {
		return fmt.Errorf("scrape %d: commit: %w", r.scrapes, err)
	}
	r.scrapes++
	return nil
}

// has says whether the series metric has a sample at rule time at.
func (r *recorder) has(ctx context.Context, metric string, at time.Duration) bool {
	q, err := r.db.Querier(ruleEpoch.Add(at).UnixMilli(), ruleEpoch.Add(at).UnixMilli())
	if err != nil {
		return false
	}
	defer q.Close()
	set := q.Select(ctx, false, nil, labels.MustNewMatcher(labels.MatchEqual, labels.MetricName, metric))
	return set.Next()
}

// fixedSpan is a recording's span that does not move.
func fixedSpan(span time.Duration) func() time.Duration { return func() time.Duration { return span } }

// ruleEpoch is rule time 0, the first scrape (as in promtool's tests).
var ruleEpoch = time.Unix(0, 0).UTC()

// ruleStep is the state of one (workload, target) at one evaluation.
type ruleStep struct {
	at         time.Duration // rule time from the first scrape
	efficiency float64       // NaN when absent
	contrast   float64       // NaN when absent
	capacity   float64       // effective capacity over its baseline; NaN when absent
	// ttftContrast: the TTFT contrast between cache classes; NaN when absent.
	ttftContrast float64
	// effAbs: the efficiency itself (not over its baseline); NaN when absent.
	effAbs float64
	// lowerBound: 1 when the effective capacity is only a lower bound, 0
	// when it is the size; NaN when absent (not measured).
	lowerBound float64
	states     map[string]rules.AlertState
	// firing: every alert of the rule files firing at this step, any
	// workload and target, with its labels (alertname included) and
	// annotations, for the cross-check by promtool.
	firing []firingAlert
}

// firingAlert is one firing alert instance.
type firingAlert struct {
	Labels, Annotations labels.Labels
}

// state is an alert's state at a step, "inactive" when not active.
func (s ruleStep) state(alert string) string {
	st, ok := s.states[alert]
	if !ok {
		return "inactive"
	}
	return st.String()
}

// ruleFiles are both rule files, recording rules first.
func ruleFiles(root string) []string {
	dir := filepath.Join(root, "dashboards", "rules")
	return []string{filepath.Join(dir, "kvload-rules.yml"), filepath.Join(dir, "kvload-alerts.yml")}
}

// ruleGroupOrder: the alerts read the recording rules of the same step.
var ruleGroupOrder = []string{"kvload.rules", "kvload.alerts"}

// evaluateRules runs the rule groups over what the recorder stored, at
// every interval from rule time 0 to the last scrape, and returns the
// states of the given alerts and the cache signals for (workload, target).
func evaluateRules(ctx context.Context, files []string, st storage.Storage, last time.Duration, interval time.Duration,
	workload, target string, alerts []string,
) ([]ruleStep, error) {
	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples: 50_000_000, Timeout: time.Minute, EnableNegativeOffset: true, EnableAtModifier: true,
	})
	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:  rules.EngineQueryFunc(engine, st),
		Appendable: st,
		Queryable:  st,
		Context:    ctx,
		NotifyFunc: func(context.Context, string, ...*rules.Alert) {},
	})
	loaded, errs := m.LoadGroups(interval, labels.EmptyLabels(), "", nil, false, files...)
	if len(errs) > 0 {
		return nil, fmt.Errorf("load rules: %w", errs[0])
	}
	byName := map[string]*rules.Group{}
	for g := range maps.Values(loaded) {
		byName[g.Name()] = g
	}
	var groups []*rules.Group
	for _, name := range ruleGroupOrder {
		g, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("rule group %s not in %v", name, files)
		}
		groups = append(groups, g)
	}
	watched := map[string]*rules.AlertingRule{}
	var alerting []*rules.AlertingRule
	for _, g := range groups {
		for _, r := range g.Rules() {
			if a, ok := r.(*rules.AlertingRule); ok {
				// Nothing to restore from: a fresh start, as promtool does.
				a.SetRestored(true)
				alerting = append(alerting, a)
				if slices.Contains(alerts, a.Name()) {
					watched[a.Name()] = a
				}
			}
		}
	}
	for _, a := range alerts {
		if watched[a] == nil {
			return nil, fmt.Errorf("alert %s not in %v", a, files)
		}
	}

	sel := fmt.Sprintf(`{workload=%q,target=%q}`, workload, target)
	query := func(expr string, ts time.Time) (float64, error) {
		q, err := engine.NewInstantQuery(ctx, st, nil, expr+sel, ts)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", expr, err)
		}
		defer q.Close()
		res := q.Exec(ctx)
		if res.Err != nil {
			return 0, fmt.Errorf("%s at %v: %w", expr, ts.Sub(ruleEpoch), res.Err)
		}
		v, err := res.Vector()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", expr, err)
		}
		switch len(v) {
		case 0:
			return math.NaN(), nil
		case 1:
			return v[0].F, nil
		}
		return 0, fmt.Errorf("%s: %d series", expr, len(v))
	}

	var steps []ruleStep
	for at := time.Duration(0); at <= last; at += interval {
		ts := ruleEpoch.Add(at)
		for _, g := range groups {
			g.Eval(ctx, ts)
			for _, r := range g.Rules() {
				if err := r.LastError(); err != nil {
					return nil, fmt.Errorf("rule %s at %v: %w", r.Name(), at, err)
				}
			}
		}
		s := ruleStep{at: at, states: map[string]rules.AlertState{}}
		var err error
		if s.efficiency, err = query(efficiencyRule, ts); err != nil {
			return nil, err
		}
		if s.contrast, err = query(contrastRule, ts); err != nil {
			return nil, err
		}
		if s.capacity, err = query(capacityRule, ts); err != nil {
			return nil, err
		}
		if s.ttftContrast, err = query("workload_target:kvload_cache_ttft_contrast:ratio_rate5m", ts); err != nil {
			return nil, err
		}
		if s.effAbs, err = query("workload_target:kvload_cache_efficiency:ratio_rate5m", ts); err != nil {
			return nil, err
		}
		if s.lowerBound, err = query("kvload_cache_effective_capacity_lower_bound", ts); err != nil {
			return nil, err
		}
		for _, a := range alerting {
			for _, al := range a.ActiveAlerts() {
				if al.State == rules.StateFiring {
					s.firing = append(s.firing, firingAlert{Labels: al.Labels.Copy(), Annotations: al.Annotations.Copy()})
				}
			}
		}
		for name, a := range watched {
			for _, al := range a.ActiveAlerts() {
				// An alert of a target's engine has no workload label.
				w := al.Labels.Get("workload")
				if (w == workload || w == "") && al.Labels.Get("target") == target {
					s.states[name] = al.State
				}
			}
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// alertThreshold reads the number an alert compares a recorded series
// with (e.g. 0.7 in "workload_target:kvload_cache_efficiency:ratio_rate5m
// < 0.7"), and the alert's for duration, from the rule file as it is.
func alertThreshold(files []string, alert, series string) (threshold float64, hold time.Duration, err error) {
	m := rules.NewManager(&rules.ManagerOptions{Context: context.Background()})
	loaded, errs := m.LoadGroups(time.Minute, labels.EmptyLabels(), "", nil, false, files...)
	if len(errs) > 0 {
		return 0, 0, fmt.Errorf("load rules: %w", errs[0])
	}
	for g := range maps.Values(loaded) {
		for _, r := range g.Rules() {
			a, ok := r.(*rules.AlertingRule)
			if !ok || a.Name() != alert {
				continue
			}
			found := false
			parser.Inspect(a.Query(), func(n parser.Node, _ []parser.Node) error {
				b, ok := n.(*parser.BinaryExpr)
				if !ok || found {
					return nil
				}
				vs, okL := b.LHS.(*parser.VectorSelector)
				num, okR := b.RHS.(*parser.NumberLiteral)
				if okL && okR && vs.Name == series {
					threshold, found = num.Val, true
				}
				return nil
			})
			if !found {
				return 0, 0, fmt.Errorf("alert %s: no comparison of %s with a number", alert, series)
			}
			return threshold, a.HoldDuration(), nil
		}
	}
	return 0, 0, fmt.Errorf("alert %s not in %v", alert, files)
}
