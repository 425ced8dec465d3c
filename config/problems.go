package config

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yamlSyntaxLine is the line yaml's parser names in a syntax error.
var yamlSyntaxLine = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError tells a YAML syntax error at its real line. yaml's parser
// names the line where the enclosing block began (line 1 for a key
// indented wrong four lines down); the first line at which the file,
// read up to it, no longer parses is the one to fix.
func syntaxError(data []byte, err error) error {
	m := yamlSyntaxLine.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Errorf("invalid YAML: %w", err)
	}
	reason := err.Error()[len(m[0]):]
	line := firstBadLine(data)
	if line == 0 {
		line, _ = strconv.Atoi(m[1])
	}
	return fmt.Errorf("invalid YAML: line %d: %s", line, reason)
}

// firstBadLine is the smallest n such that the file's first n lines do not
// parse as YAML, found by bisection (a prefix that fails to parse stays
// failed as lines are added, but for the rare construct a later line
// closes); 0 when every prefix parses.
func firstBadLine(data []byte) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	parses := func(n int) bool {
		var node yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:n], nil), &node)
		return err == nil
	}
	if parses(len(lines)) {
		return 0
	}
	lo, hi := 0, len(lines) // prefix lo parses, prefix hi does not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if parses(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// yamlCannot is yaml's type error: a value of one YAML kind where the
// schema wants a Go type.
var yamlCannot = regexp.MustCompile("cannot unmarshal !!(\\w+)(?: `(.*)`)? into (.+)$")

// yamlTerms tells yaml's type error in YAML's terms: what the key takes,
// and what it was given ("expected a list, got the string "vllm-a""),
// instead of Go's types and YAML's tags.
func yamlTerms(msg string) string {
	m := yamlCannot.FindStringSubmatchIndex(msg)
	if m == nil {
		return msg
	}
	tag, into := msg[m[2]:m[3]], msg[m[6]:m[7]]
	var value string
	if m[4] >= 0 {
		value = msg[m[4]:m[5]]
	}
	var got string
	switch tag {
	case "str":
		got = fmt.Sprintf("the string %q", value)
	case "int", "float":
		got = "the number " + value
	case "bool":
		got = value + " (true or false)"
	case "map":
		got = "a mapping"
	case "seq":
		got = "a list"
	case "null":
		got = "nothing"
	default:
		got = fmt.Sprintf("%q", value)
	}
	return msg[:m[0]] + "expected " + goTypeInYAML(into) + ", got " + got
}

// goTypeInYAML names what a Go type takes in YAML's words.
func goTypeInYAML(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "a mapping"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "uint"):
		return "a whole number, 0 or more"
	case strings.HasPrefix(t, "int"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "time.Duration"):
		return "a duration such as 30s"
	default:
		return "a mapping of keys"
	}
}

// withLines splits the joined problems of Validate, one a line, adding
// each problem's line where its path is a key or list item of the file,
// and leaving out those that follow from a value that did not decode, told
// already: problems under it, and a missing value above it (a list whose
// item failed to decode reads as empty).
func (c *Config) withLines(err error, undecoded []string) []error {
	var out []error
	for _, line := range strings.Split(err.Error(), "\n") {
		path, msg, ok := strings.Cut(line, ": ")
		if ok && (followsFrom(path, undecoded) || strings.Contains(msg, "required") && holdsOneOf(path, undecoded)) {
			continue
		}
		if n := c.keyLines[path]; ok && n > 0 && !strings.Contains(line, "(line ") {
			line += fmt.Sprintf(" (line %d)", n)
		}
		out = append(out, errors.New(line))
	}
	return out
}

// followsFrom tells whether path is within one of the paths given.
func followsFrom(path string, paths []string) bool {
	for _, p := range paths {
		if within(path, p) {
			return true
		}
	}
	return false
}

// holdsOneOf tells whether one of the paths given is within path.
func holdsOneOf(path string, paths []string) bool {
	for _, p := range paths {
		if within(p, path) {
			return true
		}
	}
	return false
}

// closestName is the name among names a typo away from name, if one is:
// the "did you mean" of an unknown name.
func closestName(name string, names []string) string {
	best, bestDist := "", max(len(name)/3, 1)+1
	for _, n := range names {
		if d := editDistance(name, n); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// TraceFileProblems reports the trace files of data's workloads that
// cannot be opened, each told as TraceError tells it: with a file that has
// problems of its own, loading never reaches its traces, yet the user
// should learn of all at once. Nothing when the file does not decode into
// workloads at all.
func TraceFileProblems(path string, data []byte) error {
	cfg, _ := ParseFileAll(path, data)
	if cfg == nil {
		return nil
	}
	var errs []error
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		if w.Trace == "" {
			continue
		}
		f, err := os.Open(cfg.TracePath(w))
		if err != nil {
			errs = append(errs, cfg.TraceError(w, err))
			continue
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// unknownTarget is the problem of a workload naming a target that is not
// configured: with the name a typo away, else the names there are.
func (c *Config) unknownTarget(name string) string {
	names := make([]string, len(c.Targets))
	for i := range c.Targets {
		names[i] = c.Targets[i].Name
	}
	msg := fmt.Sprintf("unknown target %q", name)
	if near := closestName(name, names); near != "" {
		return msg + fmt.Sprintf("; did you mean %q?", near)
	}
	if len(names) > 0 {
		return msg + "; the targets are " + strings.Join(names, ", ")
	}
	return msg
}

// apiPaths are the paths a target's url may wrongly end in: the API's own,
// which the exporter adds to the base URL.
var apiPaths = []string{"/v1/chat/completions", "/v1/completions", "/chat/completions", "/completions", "/v1"}

// baseOf is the base URL u should have been, when its path ends in an API
// path; the userinfo is left out, as it may hold a password.
func baseOf(u *url.URL) (string, bool) {
	p := strings.TrimSuffix(u.Path, "/")
	for _, api := range apiPaths {
		if strings.HasSuffix(p, api) {
			base := url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(p, api)}
			return base.String(), true
		}
	}
	return "", false
}
