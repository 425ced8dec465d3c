package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// keyWalk finds what yaml.v3 reports only by line: keys the schema does not
// know, and the YAML path of every line, so problems can name
// "targets[0].cache.block_size" rather than "line 5".
type keyWalk struct {
	unknown []string       // "path: unknown key ..." problems, in file order
	paths   map[int]string // line → path of the value on that line
}

func walkKeys(root *yaml.Node, t reflect.Type) *keyWalk {
	w := &keyWalk{paths: map[int]string{}}
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
	if _, seen := w.paths[n.Line]; !seen || path != "" {
		w.paths[n.Line] = path
	}
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
				w.unknown = append(w.unknown, fmt.Sprintf("%s: unknown key %q (line %d)", where, k.Value, k.Line))
				continue
			}
			w.paths[k.Line] = child
			w.walk(v, ft, child)
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	}
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
