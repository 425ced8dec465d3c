package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// profileRecord is what the summary keeps of one finished request.
type profileRecord struct {
	ok                bool
	errText           string
	sent, last        time.Time
	ttftMS, latencyMS float64
	itlMS             float64
	hasTTFT, hasITL   bool
	hasLatency        bool
	isl, osl          int
}

// profileRecords gathers every finished request of a profile run; one a
// row of the trace sent, so the trace's rows bound it.
type profileRecords struct {
	mu   sync.Mutex
	recs []profileRecord
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// add is the daemon's result hook.
func (p *profileRecords) add(r *replay.Result) {
	rec := profileRecord{ok: r.Outcome == openai.OutcomeSuccess, errText: r.Error, sent: r.Sent, last: r.LastToken, osl: r.OutputTokens, isl: r.TraceInputLength}
	if r.PromptKnown {
		rec.isl = r.PromptTokens
	}
	if rec.last.IsZero() {
		rec.last = r.Sent
	}
	if d, ok := r.TTFT(); ok {
		rec.ttftMS, rec.hasTTFT = ms(d), true
	}
	if d, ok := r.ITL(); ok {
		rec.itlMS, rec.hasITL = ms(d), true
	}
	if d, ok := r.Latency(); ok {
		rec.latencyMS, rec.hasLatency = ms(d), true
	}
	if !rec.ok && rec.errText == "" {
		rec.errText = string(r.Outcome)
	}
	p.mu.Lock()
	p.recs = append(p.recs, rec)
	p.mu.Unlock()
}

// distribution is one metric's statistics over the successful requests,
// as AIPerf computes them: numpy's linear percentiles and the population
// standard deviation.
type distribution struct {
	Unit string  `json:"unit"`
	Avg  float64 `json:"avg"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	P1   float64 `json:"p1"`
	P5   float64 `json:"p5"`
	P10  float64 `json:"p10"`
	P25  float64 `json:"p25"`
	P50  float64 `json:"p50"`
	P75  float64 `json:"p75"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Std  float64 `json:"std"`
}

// scalar is a metric with one value, such as a throughput.
type scalar struct {
	Unit string  `json:"unit"`
	Avg  float64 `json:"avg"`
}

// percentile is numpy's default (linear) percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[lo] + (rank-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// distributionOf is the statistics of values; nil when there are none.
func distributionOf(unit string, values []float64) *distribution {
	if len(values) == 0 {
		return nil
	}
	v := slices.Clone(values)
	slices.Sort(v)
	var sum float64
	for _, x := range v {
		sum += x
	}
	mean := sum / float64(len(v))
	var sq float64
	for _, x := range v {
		sq += (x - mean) * (x - mean)
	}
	return &distribution{
		Unit: unit, Avg: mean, Min: v[0], Max: v[len(v)-1],
		P1: percentile(v, 1), P5: percentile(v, 5), P10: percentile(v, 10), P25: percentile(v, 25),
		P50: percentile(v, 50), P75: percentile(v, 75), P90: percentile(v, 90), P95: percentile(v, 95), P99: percentile(v, 99),
		Std: math.Sqrt(sq / float64(len(v))),
	}
}

// profileSummary is a profile run's result: AIPerf's metrics over the
// successful requests, and what failed or was never sent.
type profileSummary struct {
	ttft, itl, latency, isl, osl *distribution
	requestThroughput            float64 // successful requests a second
	outputThroughput             float64 // output tokens a second
	duration                     time.Duration
	succeeded, failed, dropped   int
	firstError                   string
	start, end                   time.Time
}

// summary computes the run's summary. The benchmark's duration runs from
// the first request sent to the last answer, as AIPerf's does; without a
// request it is the run's.
func (p *profileRecords) summary(start, end time.Time, dropped int) profileSummary {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := profileSummary{dropped: dropped, start: start, end: end}
	var ttft, itl, lat, isl, osl []float64
	var first, last time.Time
	var outTokens int
	for _, r := range p.recs {
		if first.IsZero() || r.sent.Before(first) {
			first = r.sent
		}
		if r.last.After(last) {
			last = r.last
		}
		if !r.ok {
			s.failed++
			if s.firstError == "" {
				s.firstError = r.errText
			}
			continue
		}
		s.succeeded++
		outTokens += r.osl
		if r.hasTTFT {
			ttft = append(ttft, r.ttftMS)
		}
		if r.hasITL {
			itl = append(itl, r.itlMS)
		}
		if r.hasLatency {
			lat = append(lat, r.latencyMS)
		}
		isl = append(isl, float64(r.isl))
		osl = append(osl, float64(r.osl))
	}
	s.duration = end.Sub(start)
	if !first.IsZero() && last.After(first) {
		s.duration = last.Sub(first)
	}
	if secs := s.duration.Seconds(); secs > 0 {
		s.requestThroughput = float64(s.succeeded) / secs
		s.outputThroughput = float64(outTokens) / secs
	}
	s.ttft = distributionOf("ms", ttft)
	s.itl = distributionOf("ms", itl)
	s.latency = distributionOf("ms", lat)
	s.isl = distributionOf("tokens", isl)
	s.osl = distributionOf("tokens", osl)
	return s
}

// fixed2 formats x as Python's "{:,.2f}" does: two decimals, thousands
// separated by commas.
func fixed2(x float64) string {
	s := strconv.FormatFloat(x, 'f', 2, 64)
	neg := strings.HasPrefix(s, "-")
	whole, frac, _ := strings.Cut(strings.TrimPrefix(s, "-"), ".")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String() + "." + frac
}

// writeTable prints the summary as AIPerf's console table: one row a
// metric, columns avg, min, max, p99, p90, p50, std; N/A where a metric
// has one value or none was measured.
func (s profileSummary) writeTable(w io.Writer) error {
	header := []string{"Metric", "avg", "min", "max", "p99", "p90", "p50", "std"}
	var rows [][]string
	dist := func(name string, d *distribution) {
		if d == nil {
			rows = append(rows, []string{name, "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", "N/A"})
			return
		}
		rows = append(rows, []string{name, fixed2(d.Avg), fixed2(d.Min), fixed2(d.Max), fixed2(d.P99), fixed2(d.P90), fixed2(d.P50), fixed2(d.Std)})
	}
	one := func(name string, v float64) {
		rows = append(rows, []string{name, fixed2(v), "N/A", "N/A", "N/A", "N/A", "N/A", "N/A"})
	}
	dist("Time to First Token (ms)", s.ttft)
	dist("Request Latency (ms)", s.latency)
	dist("Inter Token Latency (ms)", s.itl)
	dist("Output Sequence Length (tokens)", s.osl)
	dist("Input Sequence Length (tokens)", s.isl)
	one("Output Token Throughput (tokens/sec)", s.outputThroughput)
	one("Request Throughput (requests/sec)", s.requestThroughput)
	one("Request Count (requests)", float64(s.succeeded))

	widths := make([]int, len(header))
	for i, h := range header {
		widths[i] = len(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	line := func(left, fill, mid, right string) string {
		parts := make([]string, len(widths))
		for i, wd := range widths {
			parts[i] = strings.Repeat(fill, wd+2)
		}
		return left + strings.Join(parts, mid) + right + "\n"
	}
	cells := func(bar string, r []string) string {
		parts := make([]string, len(r))
		for i, c := range r {
			parts[i] = " " + strings.Repeat(" ", widths[i]-len(c)) + c + " "
		}
		return bar + strings.Join(parts, bar) + bar + "\n"
	}
	var b strings.Builder
	title := "kvload-exporter profile | LLM Metrics"
	tableWidth := utf8.RuneCountInString(line("┏", "━", "┳", "┓")) - 1
	b.WriteString("\n" + strings.Repeat(" ", max(0, (tableWidth-len(title))/2)) + title + "\n")
	b.WriteString(line("┏", "━", "┳", "┓"))
	b.WriteString(cells("┃", header))
	b.WriteString(line("┡", "━", "╇", "┩"))
	for _, r := range rows {
		b.WriteString(cells("│", r))
	}
	b.WriteString(line("└", "─", "┴", "┘"))
	fmt.Fprintf(&b, "\nBenchmark Duration: %.2f sec\n", s.duration.Seconds())
	if s.failed > 0 || s.dropped > 0 {
		fmt.Fprintf(&b, "Errors: %d requests failed, %d rows were never sent (see kvload_requests_dropped_total)", s.failed, s.dropped)
		if s.firstError != "" {
			fmt.Fprintf(&b, "; the first failure: %s", s.firstError)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// profileExport is profile_export_aiperf.json: AIPerf's aggregate export,
// one object a metric tag, with the run's configuration.
type profileExport struct {
	TimeToFirstToken      *distribution `json:"time_to_first_token,omitempty"`
	RequestLatency        *distribution `json:"request_latency,omitempty"`
	InterTokenLatency     *distribution `json:"inter_token_latency,omitempty"`
	OutputSequenceLength  *distribution `json:"output_sequence_length,omitempty"`
	InputSequenceLength   *distribution `json:"input_sequence_length,omitempty"`
	OutputTokenThroughput scalar        `json:"output_token_throughput"`
	RequestThroughput     scalar        `json:"request_throughput"`
	RequestCount          scalar        `json:"request_count"`
	ErrorRequestCount     scalar        `json:"error_request_count"`
	DroppedRequestCount   scalar        `json:"dropped_request_count"`
	BenchmarkDuration     scalar        `json:"benchmark_duration"`
	StartTime             string        `json:"start_time"`
	EndTime               string        `json:"end_time"`
	InputConfig           profileInput  `json:"input_config"`
}

// profileInput is the part of the command line the export records.
type profileInput struct {
	Model        string `json:"model"`
	URL          string `json:"url"`
	EndpointType string `json:"endpoint_type"`
	InputFile    string `json:"input_file"`
	ConfigFile   string `json:"config_file"`
}

// writeJSON writes the export to path.
func (s profileSummary) writeJSON(path string, f *profileFlags, configFile string) error {
	e := profileExport{
		TimeToFirstToken: s.ttft, RequestLatency: s.latency, InterTokenLatency: s.itl,
		OutputSequenceLength: s.osl, InputSequenceLength: s.isl,
		OutputTokenThroughput: scalar{"tokens/sec", s.outputThroughput},
		RequestThroughput:     scalar{"requests/sec", s.requestThroughput},
		RequestCount:          scalar{"requests", float64(s.succeeded)},
		ErrorRequestCount:     scalar{"requests", float64(s.failed)},
		DroppedRequestCount:   scalar{"requests", float64(s.dropped)},
		BenchmarkDuration:     scalar{"sec", s.duration.Seconds()},
		StartTime:             s.start.UTC().Format(time.RFC3339Nano),
		EndTime:               s.end.UTC().Format(time.RFC3339Nano),
		InputConfig:           profileInput{Model: f.model, URL: baseURL(f.url), EndpointType: f.endpointType, InputFile: f.inputFile, ConfigFile: configFile},
	}
	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the JSON export: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the JSON export: %w", err)
	}
	return nil
}
