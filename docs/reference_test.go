// Package docs_test keeps the reference pages true to the code:
// configuration.md against the schema of config.Config, metrics.md against
// the series the daemon registers. A key or a metric added without its row
// fails here, and so does a row left behind after one is removed.
package docs_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/collector"
	"github.com/kvload-exporter/kvload-exporter/config"
)

const modulePath = "github.com/kvload-exporter/kvload-exporter"

// TestConfigurationKeysDocumented: every key of the schema has a row in
// configuration.md's tables, and every row names a key of the schema.
func TestConfigurationKeysDocumented(t *testing.T) {
	keys := schemaKeys(reflect.TypeFor[config.Config]())
	rows := tableKeys(t, readDoc(t, "configuration.md"), regexp.MustCompile(`^(targets|workloads|tracing)\b`))
	for _, k := range sortedKeys(keys) {
		if !rows[k] {
			t.Errorf("configuration.md: no row for the key `%s`", k)
		}
	}
	for _, k := range sortedKeys(rows) {
		if _, ok := keys[k]; !ok {
			t.Errorf("configuration.md: a row for `%s`, which config.Config does not have", k)
		}
	}
}

// TestConfigurationExamples: every configuration in configuration.md and
// the README is accepted by config.Parse, and the first of
// configuration.md, the complete example, sets every key of the schema.
func TestConfigurationExamples(t *testing.T) {
	blocks := yamlBlocks(readDoc(t, "configuration.md"))
	if len(blocks) == 0 {
		t.Fatal("configuration.md holds no configuration (a ```yaml block starting with targets:)")
	}
	for _, doc := range []string{"configuration.md", "../README.md"} {
		for i, b := range yamlBlocks(readDoc(t, doc)) {
			if _, err := config.Parse([]byte(b), t.TempDir()); err != nil {
				t.Errorf("%s, configuration %d: config.Parse: %v\n%s", doc, i+1, err, b)
			}
		}
	}
	keys := schemaKeys(reflect.TypeFor[config.Config]())
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(blocks[0]), &root); err != nil {
		t.Fatalf("the complete example: %v", err)
	}
	set := map[string]bool{}
	exampleKeys(&root, "", keys, set)
	// An alias, the older spelling of a key, is documented but not set:
	// giving both spellings is an error, and the example shows today's.
	for _, m := range aliasRow.FindAllStringSubmatch(readDoc(t, "configuration.md"), -1) {
		set[m[1]] = true
	}
	for _, k := range sortedKeys(keys) {
		if !set[k] {
			t.Errorf("configuration.md's complete example does not set `%s`", k)
		}
	}
}

// aliasRow matches a row of configuration.md whose key is an alias: its
// description starts with "alias:".
var aliasRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\|[^\n]*\\| alias: ")

// schemaKeys walks a configuration type as yaml.v3 decodes it and returns
// every key's path ("targets[].cache.block_size") and whether the key is a
// leaf: a scalar, a list of scalars, a free-form mapping, or a type that
// decodes itself (UnmarshalYAML) or comes from another module, whose inner
// keys are not this schema's.
func schemaKeys(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	walkStruct(t, "", out)
	return out
}

func walkStruct(t reflect.Type, prefix string, out map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		ft := deref(f.Type)
		if slices.Contains(strings.Split(opts, ","), "inline") {
			if ft.Kind() == reflect.Struct {
				walkStruct(ft, prefix, out)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml.v3's default key
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out[path] = true
		switch {
		case opaque(ft):
		case ft.Kind() == reflect.Struct:
			out[path] = false
			walkStruct(ft, path, out)
		case (ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array) && deref(ft.Elem()).Kind() == reflect.Struct && !opaque(deref(ft.Elem())):
			out[path] = false
			walkStruct(deref(ft.Elem()), path+"[]", out)
		case ft.Kind() == reflect.Map && deref(ft.Elem()).Kind() == reflect.Struct && !opaque(deref(ft.Elem())):
			out[path] = false
			walkStruct(deref(ft.Elem()), path+".*", out)
		}
	}
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// opaque tells whether a type is one key to the schema: it decodes itself,
// or it belongs to another module.
func opaque(t reflect.Type) bool {
	if _, ok := reflect.PointerTo(t).MethodByName("UnmarshalYAML"); ok {
		return true
	}
	return t.PkgPath() != "" && !strings.HasPrefix(t.PkgPath(), modulePath)
}

// exampleKeys collects the key paths a YAML document sets, in the form of
// schemaKeys, not descending below a leaf of keys.
func exampleKeys(n *yaml.Node, path string, keys map[string]bool, set map[string]bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			exampleKeys(c, path, keys, set)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := n.Content[i].Value
			if path != "" {
				p = path + "." + p
			}
			set[p] = true
			if leaf, ok := keys[p]; ok && !leaf {
				exampleKeys(n.Content[i+1], p, keys, set)
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			exampleKeys(c, path+"[]", keys, set)
		}
	}
}

// TestMetricsDocumented: every series the daemon registers has a row in
// metrics.md with its type and labels, and every row names such a series.
func TestMetricsDocumented(t *testing.T) {
	registered := daemonMetrics(t)
	doc := readDoc(t, "metrics.md")
	rows := metricRows(t, doc)
	for _, prefix := range []string{"`go_*`", "`process_*`"} {
		if !strings.Contains(doc, prefix) {
			t.Errorf("metrics.md does not mention the runtime collectors' %s series", prefix)
		}
	}
	for _, name := range sortedKeys(registered) {
		m := registered[name]
		row, ok := rows[name]
		if !ok {
			t.Errorf("metrics.md: no row for %s (%s, labels %v)", name, m.kind, m.labels)
			continue
		}
		if row.kind != m.kind {
			t.Errorf("metrics.md: %s is a %s, the row says %q", name, m.kind, row.kind)
		}
		if !slices.Equal(row.labels, m.labels) {
			t.Errorf("metrics.md: %s has labels %v, the row says %v", name, m.labels, row.labels)
		}
	}
	for _, name := range sortedKeys(rows) {
		if _, ok := registered[name]; !ok {
			t.Errorf("metrics.md: a row for %s, which the daemon does not register", name)
		}
	}
}

type metricInfo struct {
	kind   string // counter, gauge, histogram, summary
	labels []string
}

// daemonMetrics registers what the daemon registers (internal/cli's
// run: the collector, the build info, Go's runtime and process collectors)
// and describes it. The runtime and process series are Prometheus' own and
// vary with the Go version; metrics.md covers them by their prefixes.
func daemonMetrics(t *testing.T) map[string]metricInfo {
	t.Helper()
	rec := &recorder{}
	collector.New(rec)
	rec.MustRegister(versioncollector.NewCollector("kvload_exporter"))
	out := map[string]metricInfo{}
	for _, c := range rec.collectors {
		kind, err := kindOf(c)
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			name, labels, err := parseDesc(d)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = metricInfo{kind: kind, labels: labels}
		}
	}
	if len(out) == 0 {
		t.Fatal("no metric registered")
	}
	// The runtime and process collectors must stay out of the table but be
	// mentioned; check their prefixes are what metrics.md says they are.
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		ch := make(chan *prometheus.Desc, 256)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			name, _, err := parseDesc(d)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
				t.Errorf("runtime collector series %s: neither go_* nor process_*, as metrics.md says", name)
			}
		}
	}
	return out
}

// recorder is a Registerer that keeps what is registered with it.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// kindOf is a collector's metric type: from its Go type where it is a vector
// or a plain metric, else from what it collects.
func kindOf(c prometheus.Collector) (string, error) {
	switch typed := c.(type) {
	case *prometheus.CounterVec:
		return "counter", nil
	case *prometheus.GaugeVec:
		return "gauge", nil
	case *prometheus.HistogramVec:
		return "histogram", nil
	case *prometheus.SummaryVec:
		return "summary", nil
	case prometheus.Histogram:
		return "histogram", nil
	case prometheus.Gauge: // before Counter: a gauge also has Inc and Add
		return "gauge", nil
	case prometheus.Counter:
		return "counter", nil
	case interface{ ValueType() prometheus.ValueType }:
		// A collector whose series are computed at each scrape, and may
		// be none yet, says their type.
		switch typed.ValueType() {
		case prometheus.GaugeValue:
			return "gauge", nil
		case prometheus.CounterValue:
			return "counter", nil
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return "", fmt.Errorf("registering %T: %w", c, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		return "", fmt.Errorf("gathering %T: %w", c, err)
	}
	if len(mfs) != 1 {
		return "", fmt.Errorf("%T: cannot tell its type: it collects %d families", c, len(mfs))
	}
	return strings.ToLower(mfs[0].GetType().String()), nil
}

var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)".*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

// parseDesc reads a Desc's name and labels (constant and variable, sorted)
// from its String form, the only public view of them.
func parseDesc(d *prometheus.Desc) (string, []string, error) {
	m := descPattern.FindStringSubmatch(d.String())
	if m == nil {
		return "", nil, fmt.Errorf("cannot read the descriptor %s", d)
	}
	var labels []string
	for _, kv := range strings.Split(m[2], ",") {
		if name, _, ok := strings.Cut(kv, "="); ok {
			labels = append(labels, strings.TrimSpace(name))
		}
	}
	for _, l := range strings.Split(m[3], ",") {
		if l = strings.TrimSpace(l); l != "" {
			labels = append(labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
		}
	}
	sort.Strings(labels)
	return m[1], labels, nil
}

// metricRows reads metrics.md's tables whose header is
// "| metric | type | labels | unit | meaning |".
func metricRows(t *testing.T, doc string) map[string]metricInfo {
	t.Helper()
	out := map[string]metricInfo{}
	inTable := false
	for _, line := range strings.Split(doc, "\n") {
		cells := tableCells(line)
		switch {
		case cells == nil:
			inTable = false
		case len(cells) >= 3 && cells[0] == "metric" && cells[1] == "type" && cells[2] == "labels":
			inTable = true
		case inTable && !strings.HasPrefix(cells[0], "---"):
			names := backticked(cells[0])
			if len(names) != 1 || len(cells) < 3 {
				t.Errorf("metrics.md: a row must name one metric in its first cell: %s", line)
				continue
			}
			if _, dup := out[names[0]]; dup {
				t.Errorf("metrics.md: two rows for %s", names[0])
			}
			labels := backticked(cells[2])
			sort.Strings(labels)
			out[names[0]] = metricInfo{kind: cells[1], labels: labels}
		}
	}
	if len(out) == 0 {
		t.Fatal("metrics.md: no table with the header | metric | type | labels | ...")
	}
	return out
}

// tableKeys returns the first backticked word of the first cell of every
// table row that matches key.
func tableKeys(t *testing.T, doc string, key *regexp.Regexp) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		cells := tableCells(line)
		if cells == nil {
			continue
		}
		if words := backticked(cells[0]); len(words) > 0 && key.MatchString(words[0]) {
			out[words[0]] = true
		}
	}
	if len(out) == 0 {
		t.Fatal("no table row names a key")
	}
	return out
}

// tableCells splits a Markdown table row into its trimmed cells, or
// returns nil for a line that is not one.
func tableCells(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil
	}
	// A \| inside a cell is no separator.
	parts := strings.Split(strings.ReplaceAll(line[1:len(line)-1], `\|`, "\x00"), "|")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(strings.ReplaceAll(p, "\x00", "|"))
	}
	return parts
}

var backtickPattern = regexp.MustCompile("`([^`]+)`")

func backticked(s string) []string {
	var out []string
	for _, m := range backtickPattern.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// yamlBlocks returns the ```yaml blocks that are whole configurations.
func yamlBlocks(doc string) []string {
	var out []string
	rest := doc
	for {
		_, after, ok := strings.Cut(rest, "```yaml\n")
		if !ok {
			return out
		}
		block, next, ok := strings.Cut(after, "```")
		if !ok {
			return out
		}
		if strings.HasPrefix(block, "targets:") {
			out = append(out, block)
		}
		rest = next
	}
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(b, []byte("\n")) {
		t.Errorf("%s does not end with a newline", name)
	}
	return string(b)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestDesignPackageTable: the package table of design.md says, for every
// package but the command and the daemon ("all", "all below"), exactly
// which of the module's packages its non-test files import, so that the
// layering has one written source that cannot drift from the code. A
// package's own subpackages are not counted, and a name followed by a
// parenthesis ("emulate (daemontest)") is imported by that subpackage.
func TestDesignPackageTable(t *testing.T) {
	text, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([a-z0-9/]+)` \\| .* \\| ([^|]+) \\|$")
	checked := 0
	for line := range strings.SplitSeq(string(text), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pkg, listed := m[1], strings.TrimSpace(m[2])
		if listed == "all" || listed == "all below" {
			continue
		}
		want := map[string]bool{}
		if listed != "none" {
			for name := range strings.SplitSeq(listed, ",") {
				name = strings.TrimSpace(name)
				if strings.Contains(name, "(") {
					continue
				}
				want[name] = true
			}
		}
		p, err := build.Default.ImportDir(filepath.Join("..", pkg), 0)
		if err != nil {
			t.Errorf("design.md names package %s: %v", pkg, err)
			continue
		}
		imports := p.Imports
		if len(p.GoFiles) == 0 { // a package of tests only
			imports = append(slices.Clone(p.TestImports), p.XTestImports...)
		}
		got := map[string]bool{}
		for _, imp := range imports {
			name, ok := strings.CutPrefix(imp, modulePath+"/")
			if !ok || name == pkg || strings.HasPrefix(name, pkg+"/") {
				continue
			}
			got[name] = true
		}
		if !maps.Equal(got, want) {
			t.Errorf("design.md: %s imports %v, the table says %v", pkg, sortedSet(got), sortedSet(want))
		}
		checked++
	}
	if checked < 15 {
		t.Fatalf("design.md: %d package rows checked, want the whole table", checked)
	}
}

func sortedSet(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// maxMethods is design.md's limit on a type's methods: past it a type has
// become a hub that carries several jobs. The emulator is left out: it is
// the independent engine the tests check against, kept whole.
const maxMethods = 25

// TestTypesStaySmall: no type of the module's non-test code, outside
// emulate/ and tools/, has more than maxMethods methods.
func TestTypesStaySmall(t *testing.T) {
	counts := map[string]int{} // "dir.Type"
	skip := map[string]bool{"emulate": true, "tools": true, "testdata": true, "bin": true, "node_modules": true}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != ".." && (skip[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parsing %s: %w", path, err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			counts[filepath.Dir(path)+"."+receiverType(fn.Recv.List[0].Type)]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) < 100 {
		t.Fatalf("%d types with methods found: the walk missed the module", len(counts))
	}
	for typ, n := range counts {
		if n > maxMethods {
			t.Errorf("%s has %d methods, more than %d: split it into parts", typ, n, maxMethods)
		}
	}
}

// receiverType is the name of a method's receiver type, without its
// pointer or type parameters.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return fmt.Sprintf("%T", e)
		}
	}
}
