package dashtest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

func TestLintDashboards(t *testing.T) {
	uids := map[string]string{}
	for _, d := range loadDashboards(t) {
		t.Run(filepath.Base(d.path), func(t *testing.T) {
			if d.UID == "" || d.Title == "" {
				t.Errorf("uid %q, title %q: both must be set", d.UID, d.Title)
			}
			if other, dup := uids[d.UID]; dup {
				t.Errorf("uid %q also used by %s", d.UID, other)
			}
			uids[d.UID] = d.path
			if d.SchemaVersion < 39 {
				t.Errorf("schemaVersion %d, want 39 or later", d.SchemaVersion)
			}
			lintDatasourceRefs(t, "", d.raw)
			lintVariables(t, d)

			ids := map[int]string{}
			for _, p := range d.allPanels() {
				if p.ID <= 0 {
					t.Errorf("panel %q has no id", p.Title)
				}
				if other, dup := ids[p.ID]; dup {
					t.Errorf("panel id %d used by %q and %q", p.ID, other, p.Title)
				}
				ids[p.ID] = p.Title
				if p.Title == "" {
					t.Errorf("panel %d has no title", p.ID)
				}
				if p.Type == "row" {
					continue
				}
				if p.Datasource == nil || *p.Datasource != wantDS {
					t.Errorf("panel %q: datasource %+v, want %+v", p.Title, p.Datasource, wantDS)
				}
				if p.Description == "" {
					t.Errorf("panel %q has no description", p.Title)
				}
				if p.Type != "table" && p.FieldConfig.Defaults.Unit == "" {
					t.Errorf("panel %q has no unit", p.Title)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no queries", p.Title)
				}
				refs := map[string]bool{}
				for _, q := range p.Targets {
					if q.Datasource == nil || *q.Datasource != wantDS {
						t.Errorf("panel %q query %s: datasource %+v, want %+v", p.Title, q.RefID, q.Datasource, wantDS)
					}
					if q.RefID == "" || refs[q.RefID] {
						t.Errorf("panel %q: missing or repeated refId %q", p.Title, q.RefID)
					}
					refs[q.RefID] = true
					for _, prob := range lintDashboardExpr(q.Expr) {
						t.Errorf("panel %q query %s: %s", p.Title, q.RefID, prob)
					}
				}
			}
		})
	}
}

// lintDatasourceRefs walks the whole JSON: every "datasource" must be the
// datasource variable (the built-in Grafana annotation excepted), so that no
// uid of somebody's Grafana is baked in.
func lintDatasourceRefs(t *testing.T, path string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			p := path + "." + k
			if k == "datasource" {
				m, _ := c.(map[string]any)
				typ, _ := m["type"].(string)
				uid, _ := m["uid"].(string)
				builtin := typ == "grafana" && uid == "-- Grafana --" && strings.HasPrefix(path, ".annotations")
				if !builtin && (typ != wantDS.Type || uid != wantDS.UID) {
					t.Errorf("%s = %v, want %+v", p, c, wantDS)
				}
				continue
			}
			lintDatasourceRefs(t, p, c)
		}
	case []any:
		for i, c := range v {
			lintDatasourceRefs(t, path+"["+strconv.Itoa(i)+"]", c)
		}
	}
}

func lintVariables(t *testing.T, d *dashboard) {
	t.Helper()
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	ds, ok := vars["datasource"]
	if !ok || ds.Type != "datasource" || ds.queryString() != "prometheus" {
		t.Errorf("want a datasource variable named datasource with query prometheus, have %+v", ds)
	}
	for _, name := range []string{"job", "instance", "workload", "target"} {
		if _, ok := vars[name]; !ok {
			t.Errorf("variable %s missing", name)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		if v.Datasource == nil || *v.Datasource != wantDS {
			t.Errorf("variable %s: datasource %+v", v.Name, v.Datasource)
		}
		if v.Refresh != 2 || !v.Multi || !v.IncludeAll || v.AllValue != ".*" {
			t.Errorf("variable %s: refresh %d multi %v includeAll %v allValue %q; want 2 (on time range change), true, true, .*",
				v.Name, v.Refresh, v.Multi, v.IncludeAll, v.AllValue)
		}
		sel, label, ok := labelValues(v.queryString())
		if !ok || sel == "" {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.queryString())
			continue
		}
		if v.Definition != v.queryString() {
			t.Errorf("variable %s: definition %q differs from query %q", v.Name, v.Definition, v.queryString())
		}
		s, err := substitute(sel, dashboardVars)
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		e, err := parser.ParseExpr(s)
		if err != nil {
			t.Errorf("variable %s: selector %q: %v", v.Name, sel, err)
			continue
		}
		vs, ok := e.(*parser.VectorSelector)
		if !ok {
			t.Errorf("variable %s: %q is not a series selector", v.Name, sel)
			continue
		}
		for _, name := range selectorNames(vs) {
			if _, _, ok := lookup(name); !ok {
				t.Errorf("variable %s: metric %q is not in the contract", v.Name, name)
			}
		}
		if !regexp.MustCompile(`^\w+$`).MatchString(label) {
			t.Errorf("variable %s: label %q", v.Name, label)
		}
	}
}

func loadRules(t *testing.T) (recorded map[string]bool, alerts map[string]rulefmt.Rule) {
	t.Helper()
	root := repoRoot(t)
	recorded, alerts = map[string]bool{}, map[string]rulefmt.Rule{}
	for _, f := range []string{"kvload-rules.yml", "kvload-alerts.yml"} {
		groups, errs := rulefmt.ParseFile(filepath.Join(root, "dashboards", "rules", f), false)
		for _, err := range errs {
			t.Errorf("%s: %v", f, err)
		}
		if groups == nil {
			t.FailNow()
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					recorded[r.Record] = true
				} else {
					alerts[r.Alert] = r
				}
			}
		}
	}
	return recorded, alerts
}

func TestLintRules(t *testing.T) {
	root := repoRoot(t)
	recorded, alerts := loadRules(t)
	if len(recorded) == 0 || len(alerts) == 0 {
		t.Fatalf("%d recording rules, %d alerts", len(recorded), len(alerts))
	}
	for _, want := range []string{"KvloadCacheHitRegression", "KvloadCacheTTFTContrastLost", "KvloadCacheEngineMetricsDisagree", "KvloadTTFTRegression", "KvloadHighErrorRatio",
		"KvloadGeneratorBehind", "KvloadNoTraffic", "KvloadConfigReloadFailed"} {
		if _, ok := alerts[want]; !ok {
			t.Errorf("alert %s missing", want)
		}
	}
	for _, want := range []string{"workload_target:kvload_cache_efficiency:ratio_rate5m",
		"workload_target:kvload_cache_hit:ratio_rate5m", "workload_target:kvload_cache_theoretical_hit:ratio_rate5m",
		"workload_target:kvload_cache_reported_theoretical_hit:ratio_rate5m", "workload_target:kvload_cache_unreported:ratio_rate5m",
		"workload_target:kvload_cache_ttft_per_token:ratio_rate5m", "workload_target:kvload_cache_ttft_contrast:ratio_rate5m",
		"workload_target:kvload_request_errors:ratio_rate5m", "workload_target:kvload_schedule_lag_seconds:p99_rate5m",
		"workload_target:kvload_time_to_first_token_seconds:p99_rate5m"} {
		if !recorded[want] {
			t.Errorf("recording rule %s missing", want)
		}
	}
	for name := range recorded {
		if !recordName.MatchString(name) {
			t.Errorf("recording rule %s: want workload_target:kvload_<metric>:<operations> (or target:)", name)
		}
	}

	// Every name a rule reads is in the contract or recorded here.
	for _, f := range []string{"kvload-rules.yml", "kvload-alerts.yml"} {
		groups, _ := rulefmt.ParseFile(filepath.Join(root, "dashboards", "rules", f), false)
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				e, err := parser.ParseExpr(r.Expr)
				if err != nil {
					t.Errorf("%s %s%s: %v", f, r.Record, r.Alert, err)
					continue
				}
				parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok {
						for _, name := range selectorNames(vs) {
							if _, _, ok := lookup(name); !ok && !recorded[name] {
								t.Errorf("%s %s%s: metric %q is neither in the contract nor recorded", f, r.Record, r.Alert, name)
							}
						}
					}
					return nil
				})
			}
		}
	}

	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := markdownAnchors(string(runbook))
	const runbookBase = "https://github.com/kvload-exporter/kvload-exporter/blob/main/docs/runbook.md#"
	for name, r := range alerts {
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", name, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: annotation %s missing", name, a)
			}
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookBase)
		if !ok || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q: want %s<anchor> with the anchor a heading of docs/runbook.md (have %v)",
				name, r.Annotations["runbook_url"], runbookBase, sortedKeys(anchors))
		}
		if anchor != strings.ToLower(name) {
			t.Errorf("%s: runbook anchor %q, want %q", name, anchor, strings.ToLower(name))
		}
		// An alert must not fire on one evaluation: it holds (for:), or
		// it counts its condition over a window (a subquery).
		if r.For == 0 && !hasSubquery(r.Expr) {
			t.Errorf("%s: no for: duration and no count over a window", name)
		}
	}
	lintRuleTests(t, alerts)
}

// lintRuleTests checks that dashboards/rules/tests has, for every alert, a
// case where it fires and one where it is expected silent.
func lintRuleTests(t *testing.T, alerts map[string]rulefmt.Rule) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repoRoot(t), "dashboards", "rules", "tests", "*.yml"))
	if len(files) == 0 {
		t.Fatal("no rule unit tests in dashboards/rules/tests")
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			RuleFiles []string `yaml:"rule_files"`
			Tests     []struct {
				AlertRuleTest []struct {
					AlertName string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !slices.Contains(doc.RuleFiles, "../kvload-rules.yml") || !slices.Contains(doc.RuleFiles, "../kvload-alerts.yml") {
			t.Errorf("%s: rule_files %v, want both ../kvload-rules.yml and ../kvload-alerts.yml", f, doc.RuleFiles)
		}
		for _, tc := range doc.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.AlertName] = true
				} else {
					silent[a.AlertName] = true
				}
			}
		}
	}
	for name := range alerts {
		if !fires[name] {
			t.Errorf("%s: no rule unit test where it fires", name)
		}
		if !silent[name] {
			t.Errorf("%s: no rule unit test where it stays silent", name)
		}
	}
}

// TestLintReadme keeps README.md and this lint's contract table in step,
// and checks that the README documents every dashboard and rule file.
func TestLintReadme(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	// Names of the exporter's series (not recording rules: no colon before).
	for _, m := range regexp.MustCompile(`(?:^|[^:\w])(kvload_[a-z_]+[a-z])\b`).FindAllStringSubmatch(readme, -1) {
		if name := m[1]; !knownName(name) {
			t.Errorf("README.md names %s, which the lint's contract table lacks", name)
		}
	}
	_, section, ok := strings.Cut(readme, "\n## Dashboards and alerts\n")
	if !ok {
		t.Fatal(`README.md has no "## Dashboards and alerts" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	files, _ := filepath.Glob(filepath.Join(root, "dashboards", "*.json"))
	rules, _ := filepath.Glob(filepath.Join(root, "dashboards", "rules", "*.yml"))
	for _, f := range append(files, rules...) {
		rel, _ := filepath.Rel(root, f)
		if !strings.Contains(section, rel) {
			t.Errorf("README.md's dashboards section does not mention %s", rel)
		}
	}
	for _, d := range loadDashboards(t) {
		for _, p := range d.allPanels() {
			if p.Type == "row" && !strings.Contains(section, p.Title) {
				t.Errorf("README.md's dashboards section does not describe the row %q of %s", p.Title, filepath.Base(d.path))
			}
		}
	}
}

// TestLintHistogramForms checks the lint's rule that a histogram is read in
// both representations: quantiles from x and x_bucket, sums and counts from
// histogram_sum/histogram_count of x and from x_sum/x_count.
func TestLintHistogramForms(t *testing.T) {
	const f = `job=~"$job", instance=~"$instance", workload=~"$workload", target=~"$target"`
	const h = "kvload_cache_class_time_to_first_token_seconds"
	native := `histogram_sum(sum by (workload, target) (rate(` + h + `{` + f + `}[$__rate_interval])))`
	classic := `sum by (workload, target) (rate(` + h + `_sum{` + f + `}[$__rate_interval]))`
	count := `histogram_count(sum by (workload, target) (rate(` + h + `{` + f + `}[$__rate_interval])))`
	classicCount := `sum by (workload, target) (rate(` + h + `_count{` + f + `}[$__rate_interval]))`
	quantile := `histogram_quantile(0.9, sum by (workload, target) (rate(` + h + `{` + f + `}[$__rate_interval])))`
	bucket := `histogram_quantile(0.9, sum by (le, workload, target) (rate(` + h + `_bucket{` + f + `}[$__rate_interval])))`
	for _, c := range []struct {
		expr string
		ok   bool
	}{
		{native + " or " + classic, true},
		{count + " or " + classicCount, true},
		{quantile + " or " + bucket, true},
		{native, false},
		{classic, false},
		{classicCount, false},
		{quantile + " or " + classic, false}, // a quantile needs _bucket
		{native + " or " + bucket, false},    // a sum needs _sum or _count
	} {
		probs := lintDashboardExpr(c.expr)
		if (len(probs) == 0) != c.ok {
			t.Errorf("%s: problems %q, want ok=%v", c.expr, probs, c.ok)
		}
	}
}

// TestLintEngineFallback: vLLM's hits counter is read only as the fallback
// of its cached-prompt-token counter.
func TestLintEngineFallback(t *testing.T) {
	const f = `{job=~"$engine_job", instance=~"$engine_instance"}[$__rate_interval]`
	hits := `sum(rate(vllm:prefix_cache_hits_total` + f + `)) / sum(rate(vllm:prefix_cache_queries_total` + f + `))`
	cached := `sum(rate(vllm:prompt_tokens_cached_total` + f + `)) / sum(rate(vllm:prompt_tokens_total` + f + `))`
	for _, c := range []struct {
		expr string
		ok   bool
	}{
		{cached, true},
		{cached + " or " + hits, true},
		{hits, false},
		{`sum(rate(vllm:prefix_cache_hits_total` + f + `))`, false},
	} {
		probs := lintDashboardExpr(c.expr)
		if (len(probs) == 0) != c.ok {
			t.Errorf("%s: problems %q, want ok=%v", c.expr, probs, c.ok)
		}
	}
}
