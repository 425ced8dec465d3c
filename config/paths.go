package config

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// keyWalk finds what yaml.v3 reports only by line: keys the schema does not
// know, and the YAML path of every line, so problems can name
// "targets[0].cache.block_size" rather than "line 5".
type keyWalk struct {
	unknown []string       // "path: unknown key ..." problems, in file order
	paths   map[int]string // line → path of the value on that line
	lines   map[string]int // path of each known key → its line
	// shared marks lines holding several keys (a flow mapping such as
	// "{a: 1, b: x}"): their path is the keys' parent, since yaml.v3 names
	// only the line.
	shared map[int]bool
}

func walkKeys(root *yaml.Node, t reflect.Type) *keyWalk {
	w := &keyWalk{paths: map[int]string{}, lines: map[string]int{}, shared: map[int]bool{}}
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	w.walk(root, t, "")
	return w
}

func (w *keyWalk) walk(n *yaml.Node, t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	w.setPath(n.Line, path)
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			child := joinPath(path, k.Value)
			if !ok {
				where := path
				if where == "" {
					where = "top level"
				}
				msg := fmt.Sprintf("%s: unknown key %q (line %d)", where, k.Value, k.Line)
				if near := closestKey(k.Value, fields); near != "" {
					msg += fmt.Sprintf("; did you mean %q?", near)
				}
				w.unknown = append(w.unknown, msg)
				continue
			}
			w.setPath(k.Line, child)
			w.lines[child] = k.Line
			w.walk(v, ft, child)
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, item := range n.Content {
			child := fmt.Sprintf("%s[%d]", path, i)
			w.lines[child] = item.Line
			w.walk(item, t.Elem(), child)
		}
	}
}

// setPath records that line holds path: a deeper path of the same branch
// replaces a shallower one, a sibling's makes the line shared.
func (w *keyWalk) setPath(line int, path string) {
	old, seen := w.paths[line]
	switch {
	case w.shared[line]:
		w.paths[line] = commonParent(old, path)
	case !seen || within(path, old):
		w.paths[line] = path
	case within(old, path):
	default:
		w.paths[line] = commonParent(old, path)
		w.shared[line] = true
	}
}

// within reports whether path is inner or the same as outer.
func within(path, outer string) bool {
	return strings.HasPrefix(path, outer) && isBoundary(path, len(outer))
}

func isBoundary(path string, i int) bool {
	return i == 0 || i == len(path) || path[i] == '.' || path[i] == '['
}

// commonParent is the longest path both a and b are within.
func commonParent(a, b string) string {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && !(isBoundary(a, n) && isBoundary(b, n)) {
		n--
	}
	return a[:n]
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps the YAML keys of struct t (inline structs included) to
// their field types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range yamlFields(ft) {
					out[k] = v
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// closestKey is the known key nearest to key by edit distance, or "" when
// none is close enough to be what was meant: at most a third of the
// key's length, and at least 1, edits away. Ties go to the first in
// alphabetical order, so the advice is stable.
func closestKey(key string, fields map[string]reflect.Type) string {
	lower := strings.ToLower(key)
	best, bestDist := "", max(len(key)/3, 1)+1
	keys := slices.Sorted(maps.Keys(fields))
	for _, k := range keys {
		if d := editDistance(lower, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return best
	}
	// A shortened key ("speedup" for "speedup_ratio") is no typo away but
	// names one key only: that one.
	var prefixed []string
	for _, k := range keys {
		if len(lower) >= 4 && strings.HasPrefix(k, lower) {
			prefixed = append(prefixed, k)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	return ""
}

// editDistance is the edit distance between a and b, in bytes (keys are
// ASCII): insertions, deletions, substitutions and swaps of two adjacent
// letters, the commonest typo, each count one.
func editDistance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

var linePrefix = regexp.MustCompile(`^line (\d+): `)

// locate rewrites yaml.v3's "line N: reason" into "path: reason (line N)".
func (w *keyWalk) locate(msg string) string {
	m := linePrefix.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	path, ok := w.paths[line]
	if !ok || path == "" {
		return msg
	}
	return fmt.Sprintf("%s: %s (line %d)", path, msg[len(m[0]):], line)
}

// stringTypes holds the Go names of the schema's named string types
// (replay.LoopMode, engine.Observed, ...), found by walking the schema's
// structs: this package's and those of the components it takes whole
// (emulate.Config), all of this module.
var stringTypes = func() map[string]bool {
	names := map[string]bool{}
	module := path.Dir(reflect.TypeOf(Config{}).PkgPath())
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		switch {
		case t.Kind() == reflect.String && t.PkgPath() != "":
			names[t.String()] = true
		case t.Kind() == reflect.Struct && strings.HasPrefix(t.PkgPath(), module+"/"):
			for _, ft := range yamlFields(t) {
				walk(ft)
			}
		}
	}
	walk(reflect.TypeOf(Config{}))
	return names
}()

// plainTypes rewrites yaml.v3's "cannot unmarshal !!map into
// replay.LoopMode" as "... into string": the YAML holds a plain string,
// and the Go name means nothing to its author.
func plainTypes(msg string) string {
	i := strings.LastIndex(msg, " into ")
	if i >= 0 && stringTypes[msg[i+len(" into "):]] {
		return msg[:i] + " into string"
	}
	return msg
}

// fingerprints renders each entry of targets and workloads canonically:
// comments, quoting and layout do not matter, values do.
func fingerprints(root *yaml.Node) map[string]string {
	out := map[string]string{}
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return out
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		kind := strings.TrimSuffix(root.Content[i].Value, "s") // targets → target
		list := root.Content[i+1]
		if list.Kind != yaml.SequenceNode {
			continue
		}
		for _, item := range list.Content {
			var name string
			for j := 0; j+1 < len(item.Content); j += 2 {
				if item.Content[j].Value == "name" {
					name = item.Content[j+1].Value
				}
			}
			var b strings.Builder
			canonical(&b, item)
			out[kind+"/"+name] = b.String()
		}
	}
	return out
}

func canonical(b *strings.Builder, n *yaml.Node) {
	switch n.Kind {
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			canonical(b, n.Content[i])
			b.WriteByte(':')
			canonical(b, n.Content[i+1])
			b.WriteByte(',')
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for _, c := range n.Content {
			canonical(b, c)
			b.WriteByte(',')
		}
		b.WriteByte(']')
	case yaml.AliasNode:
		canonical(b, n.Alias)
	default:
		b.WriteString(strconv.Quote(n.Tag + " " + n.Value))
	}
}

// checkBytes reports, with its line, what yaml.v3 rejects without saying
// where: invalid UTF-8 and control characters (NUL and the like).
func checkBytes(data []byte) error {
	line := 1
	for i := 0; i < len(data); {
		c := data[i]
		if c == '\n' {
			line++
		}
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' || c == 0x7f {
			return fmt.Errorf("line %d: control character %U is not allowed in YAML", line, rune(c))
		}
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("line %d: invalid UTF-8", line)
		}
		i += n
	}
	return nil
}

// topNode is the document's content node, nil for an empty document.
func topNode(root *yaml.Node) *yaml.Node {
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil
		}
		return root.Content[0]
	}
	if root.Kind == 0 {
		return nil
	}
	return root
}

// nodeKind names a node's YAML kind for messages.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	default:
		return "a scalar"
	}
}

// locateFailures appends "path: error (line N)" for the deepest nodes whose
// decoding into t fails with an error other than a type error, and reports
// whether it found any.
func locateFailures(n *yaml.Node, t reflect.Type, path string, out *[]string) bool {
	if n == nil {
		return false
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	err := n.Decode(reflect.New(t).Interface())
	var te *yaml.TypeError
	if err == nil || errors.As(err, &te) {
		return false
	}
	found := false
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			if ft, ok := fields[n.Content[i].Value]; ok {
				found = locateFailures(n.Content[i+1], ft, joinPath(path, n.Content[i].Value), out) || found
			}
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, item := range n.Content {
			found = locateFailures(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out) || found
		}
	}
	if !found && path != "" {
		*out = append(*out, fmt.Sprintf("%s: %v (line %d)", path, err, n.Line))
		found = true
	}
	return found
}
