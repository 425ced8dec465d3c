package synth

import (
	"bytes"
	"io"
	"strconv"
	"strings"
)

// WriteAIPerf writes the report as AIPerf's analyze-trace prints it on the
// console: the summary lines, ratios in percent ("{:.2%}"), then each
// distribution as a block of lines with two decimals and thousands
// separators ("{:,.2f}"). AIPerf's versions differ in which summary lines
// they print; this one has them all (prefix groups and cache hit rate
// included). The numbers are those of the table and the JSON, only
// rounded.
func (an *Analysis) WriteAIPerf(w io.Writer) error {
	var b bytes.Buffer
	rule := strings.Repeat("=", 60)
	b.WriteString("\nTrace Analysis Report\n" + rule + "\n")
	line := func(name, value string) {
		b.WriteString(name + ":" + strings.Repeat(" ", max(1, 22-len(name))) + value + "\n")
	}
	line("Total requests", groupThousands(an.TotalRequests))
	line("Unique prefixes", groupThousands(an.UniquePrefixes))
	line("Prefix groups", groupThousands(an.PrefixGroups))
	line("Cache hit rate", pyPercent(an.CacheHitRate))
	line("Prefix reuse ratio", pyPercent(an.PrefixReuseRatio))
	for _, r := range an.statRows() {
		b.WriteString("\n" + r.name + ":\n")
		if r.stats == nil {
			b.WriteString("  No data\n\n")
			continue
		}
		s := r.stats
		for _, f := range []struct {
			name string
			v    float64
		}{
			{"Mean:   ", s.Mean}, {"Std Dev:", s.StdDev}, {"Min:    ", s.Min}, {"P25:    ", s.P25},
			{"Median: ", s.Median}, {"P75:    ", s.P75}, {"Max:    ", s.Max},
		} {
			b.WriteString("  " + f.name + " " + pyFixed2(f.v) + "\n")
		}
	}
	b.WriteString(rule + "\n\n")
	_, err := w.Write(b.Bytes())
	return err
}

// pyFixed2 formats x like Python's "{:,.2f}": correctly rounded to two
// decimals, with thousands separators.
func pyFixed2(x float64) string {
	s := strconv.FormatFloat(x, 'f', 2, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	var g strings.Builder
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			g.WriteByte(',')
		}
		g.WriteRune(c)
	}
	out := g.String() + "." + frac
	if neg {
		return "-" + out
	}
	return out
}

// pyPercent formats x like Python's "{:.2%}": x·100 with two decimals and
// a percent sign.
func pyPercent(x float64) string {
	return strconv.FormatFloat(x*100, 'f', 2, 64) + "%"
}
