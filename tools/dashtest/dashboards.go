// Package dashtest tests the Grafana dashboards and the Prometheus rules
// under dashboards/: a static lint (lint.go), an end-to-end run against a
// real Prometheus, the exporter and the engine emulator (prometheus.go),
// the alert scenarios and their recordings (alertsim.go, alerttape.go,
// rulesim.go, promtoolcheck.go) and real engines (engines.go). Each file's
// tests are beside it. It lives in the tools module so that the main
// module does not depend on Prometheus; its non-test files are test
// helpers, imported by nothing.
package dashtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// dsRef is a panel's or target's datasource reference.
type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// wantDS is the only datasource reference a panel may carry.
var wantDS = dsRef{Type: "prometheus", UID: "${datasource}"}

type dashboard struct {
	path          string
	raw           map[string]any
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []panel
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int     `json:"id"`
	Type        string  `json:"type"`
	Title       string  `json:"title"`
	Description string  `json:"description"`
	Datasource  *dsRef  `json:"datasource"`
	Targets     []query `json:"targets"`
	Panels      []panel `json:"panels"` // a collapsed row's panels
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

type query struct {
	RefID      string `json:"refId"`
	Expr       string `json:"expr"`
	Datasource *dsRef `json:"datasource"`
}

type variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      any    `json:"query"`
	Definition string `json:"definition"`
	Refresh    int    `json:"refresh"`
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue"`
	Datasource *dsRef `json:"datasource"`
}

// queryString is the variable's query text, whichever of Grafana's two
// shapes (string, or object with "query") the JSON uses.
func (v variable) queryString() string {
	switch q := v.Query.(type) {
	case string:
		return q
	case map[string]any:
		s, _ := q["query"].(string)
		return s
	}
	return ""
}

// repoRoot is the main module's directory, two levels above this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(gomod), "module github.com/kvload-exporter/kvload-exporter\n") {
		t.Fatalf("%s is not the kvload-exporter repository (go.mod: %v)", root, err)
	}
	return root
}

// loadDashboards reads every dashboards/*.json.
func loadDashboards(t testing.TB) []*dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "dashboards", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("want at least two dashboards, found %v", files)
	}
	sort.Strings(files)
	var out []*dashboard
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := &dashboard{path: f}
		if err := json.Unmarshal(b, d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := json.Unmarshal(b, &d.raw); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, d)
	}
	return out
}

// allPanels lists every panel, rows and the panels of collapsed rows
// included.
func (d *dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// panelQuery is one PromQL expression of one panel.
type panelQuery struct {
	Dashboard, Panel, RefID, Expr string
}

func (q panelQuery) String() string {
	return fmt.Sprintf("%s: %q %s", filepath.Base(q.Dashboard), q.Panel, q.RefID)
}

// queries lists every panel query of the dashboard.
func (d *dashboard) queries() []panelQuery {
	var out []panelQuery
	for _, p := range d.allPanels() {
		for _, q := range p.Targets {
			out = append(out, panelQuery{Dashboard: d.path, Panel: p.Title, RefID: q.RefID, Expr: q.Expr})
		}
	}
	return out
}

var varRef = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// substitute replaces Grafana variables in expr with vals. The built-in
// interval variables must be in vals too; an unknown variable is an error
// ($1-style regex back references are left alone).
func substitute(expr string, vals map[string]string) (string, error) {
	var missing []string
	out := varRef.ReplaceAllStringFunc(expr, func(m string) string {
		sm := varRef.FindStringSubmatch(m)
		name := sm[1] + sm[2] + sm[3]
		if regexp.MustCompile(`^\d+$`).MatchString(name) {
			return m
		}
		v, ok := vals[name]
		if !ok {
			missing = append(missing, m)
			return m
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("unknown variables %v", missing)
	}
	return out, nil
}

var labelValuesRe = regexp.MustCompile(`^label_values\((?:(.*),\s*)?(\w+)\)$`)

// labelValues splits a label_values(selector, label) variable query.
func labelValues(q string) (selector, label string, ok bool) {
	m := labelValuesRe.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return "", "", false
	}
	return strings.TrimSpace(m[1]), m[2], true
}
