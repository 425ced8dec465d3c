package dashtest

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"gopkg.in/yaml.v3"
)

// promtoolFile is a promtool rule unit test file (its YAML keys).
type promtoolFile struct {
	RuleFiles          []string        `yaml:"rule_files"`
	EvaluationInterval string          `yaml:"evaluation_interval"`
	GroupEvalOrder     []string        `yaml:"group_eval_order"`
	Tests              []promtoolGroup `yaml:"tests"`
}

type promtoolGroup struct {
	Name           string              `yaml:"name"`
	Interval       string              `yaml:"interval"`
	InputSeries    []promtoolSeries    `yaml:"input_series"`
	AlertRuleTests []promtoolAlertTest `yaml:"alert_rule_test"`
}

type promtoolSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type promtoolAlertTest struct {
	EvalTime  string          `yaml:"eval_time"`
	Alertname string          `yaml:"alertname"`
	ExpAlerts []promtoolAlert `yaml:"exp_alerts"`
}

type promtoolAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels,omitempty"`
	ExpAnnotations map[string]string `yaml:"exp_annotations,omitempty"`
}

// ruleInputs reads the rule files: the metric names their expressions
// select that no rule of theirs records (what a scrape must provide), and
// the names of their alerts.
func ruleInputs(files []string) (inputs, alerts []string, err error) {
	recorded := map[string]bool{}
	selected := map[string]bool{}
	for _, f := range files {
		groups, errs := rulefmt.ParseFile(f, false)
		if len(errs) > 0 {
			return nil, nil, fmt.Errorf("%s: %w", f, errs[0])
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					recorded[r.Record] = true
				}
				if r.Alert != "" {
					alerts = append(alerts, r.Alert)
				}
				expr, err := parser.ParseExpr(r.Expr)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %s: %w", f, r.Record+r.Alert, err)
				}
				parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok {
						name := vs.Name
						for _, m := range vs.LabelMatchers {
							if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
								name = m.Value
							}
						}
						if name != "" {
							selected[name] = true
						}
					}
					return nil
				})
			}
		}
	}
	for name := range selected {
		if !recorded[name] {
			inputs = append(inputs, name)
		}
	}
	slices.Sort(inputs)
	return inputs, alerts, nil
}

// promtoolInputSeries turns the stored samples of the given metric names,
// from rule time 0 to last, into promtool input series at interval: one
// value per step, "_" where a series has none. Every sample must sit on a
// step.
func promtoolInputSeries(ctx context.Context, st storage.Queryable, names []string, last, interval time.Duration) ([]promtoolSeries, error) {
	steps := int(last/interval) + 1
	q, err := st.Querier(ruleEpoch.UnixMilli(), ruleEpoch.Add(last).UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("querier: %w", err)
	}
	defer q.Close()
	m, err := labels.NewMatcher(labels.MatchRegexp, labels.MetricName, strings.Join(names, "|"))
	if err != nil {
		return nil, fmt.Errorf("matcher: %w", err)
	}
	set := q.Select(ctx, true, nil, m)
	var out []promtoolSeries
	var it chunkenc.Iterator
	for set.Next() {
		s := set.At()
		vals := make([]string, steps)
		for i := range vals {
			vals[i] = "_"
		}
		it = s.Iterator(it)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			if vt != chunkenc.ValFloat {
				return nil, fmt.Errorf("%s: a %v sample; only floats are written", s.Labels(), vt)
			}
			ts, v := it.At()
			off := time.Duration(ts-ruleEpoch.UnixMilli()) * time.Millisecond
			if off%interval != 0 {
				return nil, fmt.Errorf("%s: a sample at %v, not on the %v grid", s.Labels(), off, interval)
			}
			vals[off/interval] = promtoolValue(v)
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Labels(), err)
		}
		lb := labels.NewBuilder(s.Labels())
		lb.Del(labels.MetricName)
		out = append(out, promtoolSeries{
			Series: s.Labels().Get(labels.MetricName) + lb.Labels().String(),
			Values: strings.Join(vals, " "),
		})
	}
	if err := set.Err(); err != nil {
		return nil, fmt.Errorf("select: %w", err)
	}
	return out, nil
}

// promtoolValue writes a sample so that it reads back as the same float.
func promtoolValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// promtoolAlertTests expects, at every rule-minute of steps, for every
// alert of the rule files, exactly the alerts the library had firing.
func promtoolAlertTests(steps []ruleStep, alerts []string) []promtoolAlertTest {
	var tests []promtoolAlertTest
	for _, s := range steps {
		if s.at%time.Minute != 0 {
			continue
		}
		for _, name := range alerts {
			exp := []promtoolAlert{}
			for _, f := range s.firing {
				if f.Labels.Get(labels.AlertName) != name {
					continue
				}
				lb := labels.NewBuilder(f.Labels)
				lb.Del(labels.AlertName)
				exp = append(exp, promtoolAlert{ExpLabels: lb.Labels().Map(), ExpAnnotations: f.Annotations.Map()})
			}
			tests = append(tests, promtoolAlertTest{EvalTime: model.Duration(s.at).String(), Alertname: name, ExpAlerts: exp})
		}
	}
	return tests
}

// writePromtoolTest writes, at path, the promtool rule unit test of what
// the library made of the recording in st (steps, up to rule time last).
func writePromtoolTest(ctx context.Context, path string, files []string, st storage.Queryable, steps []ruleStep, last, interval time.Duration) error {
	inputs, alerts, err := ruleInputs(files)
	if err != nil {
		return err
	}
	series, err := promtoolInputSeries(ctx, st, inputs, last, interval)
	if err != nil {
		return err
	}
	f := promtoolFile{
		RuleFiles:          files,
		EvaluationInterval: model.Duration(interval).String(),
		GroupEvalOrder:     ruleGroupOrder,
		Tests: []promtoolGroup{{
			Name:           "recorded",
			Interval:       model.Duration(interval).String(),
			InputSeries:    series,
			AlertRuleTests: promtoolAlertTests(steps, alerts),
		}},
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("promtool test: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("promtool test: %w", err)
	}
	return nil
}

// promtoolTestRules runs `promtool test rules` on a file; its output is in
// the error when it fails.
func promtoolTestRules(ctx context.Context, promtool, path string) error {
	out, err := exec.CommandContext(ctx, promtool, "test", "rules", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("promtool test rules %s: %w\n%s", path, err, out)
	}
	return nil
}

// crossCheckWithPromtool writes the promtool test of a scenario's
// recording into dir (kept as the test's artefact) and runs it.
func crossCheckWithPromtool(t *testing.T, promtool, dir string, files []string, st storage.Queryable, steps []ruleStep, interval time.Duration) {
	t.Helper()
	if len(steps) == 0 {
		t.Fatal("no rule evaluation to cross-check")
	}
	path := filepath.Join(dir, "promtool-crosscheck.yml")
	last := steps[len(steps)-1].at
	if err := writePromtoolTest(t.Context(), path, files, st, steps, last, interval); err != nil {
		t.Fatal(err)
	}
	if err := promtoolTestRules(t.Context(), promtool, path); err != nil {
		t.Errorf("promtool disagrees with the rule engine on this recording: %v", err)
		return
	}
	t.Logf("promtool agrees with the rule engine at every rule-minute (%s)", path)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
