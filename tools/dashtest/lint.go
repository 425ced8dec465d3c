package dashtest

import (
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type metricKind int

type scope int

type metric struct {
	kind  metricKind
	scope scope
}

// contract is the metric table of docs/contract.md (and README.md), plus
// the engine metrics the cache dashboard reads. Dashboards and rules may
// use no other name (besides the recording rules' own).
var contract = map[string]metric{
	"kvload_requests_total":                               {counter, workloadTarget},
	"kvload_requests_dropped_total":                       {counter, workloadTarget},
	"kvload_requests_in_flight":                           {gauge, workloadTarget},
	"kvload_schedule_lag_seconds":                         {histogram, workloadTarget},
	"kvload_time_to_first_token_seconds":                  {histogram, workloadTarget},
	"kvload_inter_token_latency_seconds":                  {histogram, workloadTarget},
	"kvload_request_duration_seconds":                     {histogram, workloadTarget},
	"kvload_prompt_tokens_total":                          {counter, workloadTarget},
	"kvload_trace_prompt_tokens_total":                    {counter, workloadTarget},
	"kvload_completion_tokens_total":                      {counter, workloadTarget},
	"kvload_cached_prompt_tokens_total":                   {counter, workloadTarget},
	"kvload_theoretical_cached_prompt_tokens_total":       {counter, workloadTarget},
	"kvload_trace_loops_total":                            {counter, workloadOnly},
	"kvload_target_info":                                  {gauge, targetOnly},
	"kvload_config_last_reload_successful":                {gauge, exporterWide},
	"kvload_config_last_reload_success_timestamp_seconds": {gauge, exporterWide},
	"kvload_exporter_build_info":                          {gauge, exporterWide},
	"kvload_tracing_export_errors_total":                  {counter, exporterWide},

	// Prefix-cache accounting: requests that reported a cached count or
	// not, TTFT by theoretical cache class, the model's capacity per target.
	"kvload_cache_reported_prompt_tokens_total":                    {counter, workloadTarget},
	"kvload_cache_reported_cached_prompt_tokens_total":             {counter, workloadTarget},
	"kvload_cache_reported_trace_prompt_tokens_total":              {counter, workloadTarget},
	"kvload_cache_reported_theoretical_cached_prompt_tokens_total": {counter, workloadTarget},
	"kvload_cache_unreported_requests_total":                       {counter, workloadTarget},
	"kvload_cache_class_time_to_first_token_seconds":               {histogram, workloadTarget},
	"kvload_cache_class_trace_prompt_tokens_total":                 {counter, workloadTarget},
	"kvload_target_cache_capacity_blocks":                          {gauge, targetOnly},
	"kvload_target_cache_block_size_tokens":                        {gauge, targetOnly},
	"kvload_target_cache_capacity_known":                           {gauge, targetOnly},
	"kvload_target_cache_preamble_tokens":                          {gauge, targetOnly},
	"kvload_target_tokenize_ratio":                                 {gauge, targetOnly},
	"kvload_server_metrics_errors_total":                           {counter, targetOnly},
	"kvload_cache_effective_capacity_tokens":                       {gauge, workloadTarget},
	"kvload_cache_effective_capacity_state":                        {gauge, workloadTarget},
	"kvload_cache_effective_capacity_window_seconds":               {gauge, workloadTarget},
	"kvload_cache_effective_capacity_lower_bound":                  {gauge, workloadTarget},
	"kvload_cache_cached_token_cost_ratio":                         {gauge, workloadTarget},
	"kvload_cache_missed_hit_tokens_total":                         {counter, workloadTarget},
	"kvload_cache_reconcile_engine_cached_tokens_total":            {counter, targetOnly},
	"kvload_cache_reconcile_engine_prompt_tokens_total":            {counter, targetOnly},
	"kvload_cache_reconcile_canary_prompt_tokens_total":            {counter, targetOnly},
	"kvload_cache_reconcile_usage_prompt_tokens_total":             {counter, targetOnly},
	"kvload_cache_reconcile_usage_cached_tokens_total":             {counter, targetOnly},
	"kvload_cache_reconcile_errors_total":                          {counter, targetOnly},
	"kvload_cache_reconcile_state":                                 {gauge, targetOnly},
	"kvload_cache_reconcile_canary_share":                          {gauge, targetOnly},
	"kvload_cache_reconcile_engine_over_usage_ratio":               {gauge, targetOnly},
	"kvload_cache_reconcile_usage_over_model_ratio":                {gauge, targetOnly},
	"kvload_cache_reconcile_engine_over_model_ratio":               {gauge, targetOnly},

	// Service-level objectives (workloads[].slo).
	"kvload_slo_requests_total":      {counter, workloadTarget},
	"kvload_slo_good_requests_total": {counter, workloadTarget},
	"kvload_slo_objective_ratio":     {gauge, workloadTarget},
	"kvload_slo_threshold_seconds":   {gauge, workloadTarget},

	"vllm:prompt_tokens_cached_total": {counter, engine},
	"vllm:prompt_tokens_total":        {counter, engine},
	"vllm:prefix_cache_hits_total":    {counter, engine},
	"vllm:prefix_cache_queries_total": {counter, engine},
	"sglang:cached_tokens_total":      {counter, engine},
	"sglang:prompt_tokens_total":      {counter, engine},
}

// fallbackOnly are engine counters a query may read only beside the
// cleaner counter it falls back from: vLLM's hits counter counts a
// preempted request's lookups again, recomputed tokens as hits (vLLM issue
// 25780), and is for releases without prompt_tokens_cached.
var fallbackOnly = map[string]string{"vllm:prefix_cache_hits_total": "vllm:prompt_tokens_cached_total"}

// rawCounterOK are counters a panel may show without rate(): the number of
// completed trace passes is read as is.
var rawCounterOK = map[string]bool{"kvload_trace_loops_total": true}

// lookup resolves a series name (with a histogram's _bucket/_sum/_count) to
// its contract entry.
func lookup(name string) (string, metric, bool) {
	if m, ok := contract[name]; ok {
		return name, m, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if m, ok := contract[base]; ok && m.kind == histogram {
				return base, m, true
			}
		}
	}
	return "", metric{}, false
}

// selectorNames lists the metric names a vector selector can match: its
// name, or the alternatives of a __name__ matcher.
func selectorNames(vs *parser.VectorSelector) []string {
	if vs.Name != "" {
		return []string{vs.Name}
	}
	for _, m := range vs.LabelMatchers {
		if m.Name != labels.MetricName {
			continue
		}
		switch m.Type {
		case labels.MatchEqual:
			return []string{m.Value}
		case labels.MatchRegexp:
			return strings.Split(m.Value, "|")
		}
	}
	return []string{""}
}

func matcher(vs *parser.VectorSelector, name string) *labels.Matcher {
	for _, m := range vs.LabelMatchers {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// rateSentinel stands for $__rate_interval while parsing, so that every
// range can be checked to be it.
const rateSentinel = "4242s"

var dashboardVars = map[string]string{
	"__rate_interval": rateSentinel,
	"job":             "$job", "instance": "$instance",
	"workload": "$workload", "target": "$target",
	"engine_job": "$engine_job", "engine_instance": "$engine_instance",
}

// wantFilter names, per scope, the label=~"$var" filters every selector of a
// dashboard query must carry.
var wantFilter = map[scope][]string{
	workloadTarget: {"job", "instance", "workload", "target"},
	workloadOnly:   {"job", "instance", "workload"},
	targetOnly:     {"job", "instance", "target"},
	exporterWide:   {"job", "instance"},
	engine:         {"job:engine_job", "instance:engine_instance"},
}

// lintDashboardExpr checks one panel query; it returns the problems.
func lintDashboardExpr(expr string) []string {
	var probs []string
	s, err := substitute(expr, dashboardVars)
	if err != nil {
		return []string{err.Error()}
	}
	// Variables stay as regex text ("$job"), which parses as a regex.
	e, err := parser.ParseExpr(s)
	if err != nil {
		return []string{"does not parse: " + err.Error()}
	}
	sentinel, _ := time.ParseDuration(rateSentinel)
	// Quantiles: native x and classic x_bucket. Sums and counts
	// (histogram_sum/histogram_count of x): classic x_sum and x_count.
	hasNative, hasClassic := map[string]bool{}, map[string]bool{}
	hasNativeSum, hasClassicSum := map[string]bool{}, map[string]bool{}
	read := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		switch n := n.(type) {
		case *parser.SubqueryExpr:
			probs = append(probs, "subquery "+n.String()+": use $__rate_interval ranges only")
		case *parser.MatrixSelector:
			if n.Range != sentinel {
				probs = append(probs, "range of "+n.String()+" is not $__rate_interval")
			}
		case *parser.VectorSelector:
			inRange := len(path) > 0
			if inRange {
				_, inRange = path[len(path)-1].(*parser.MatrixSelector)
			}
			for _, name := range selectorNames(n) {
				read[name] = true
				base, m, ok := lookup(name)
				if !ok {
					probs = append(probs, "metric "+name+" is not in the contract")
					continue
				}
				if (m.kind == counter || m.kind == histogram) && !inRange && !rawCounterOK[base] {
					probs = append(probs, name+" is a counter: use it in rate()")
				}
				if m.kind == histogram {
					switch f := histogramFunc(path); {
					case name == base && (f == "histogram_sum" || f == "histogram_count"):
						hasNativeSum[base] = true
					case name == base:
						hasNative[base] = true
					case strings.HasSuffix(name, "_bucket"):
						hasClassic[base] = true
					default:
						hasClassicSum[base] = true
					}
				}
				for _, f := range wantFilter[m.scope] {
					label, v, _ := strings.Cut(f, ":")
					if v == "" {
						v = label
					}
					mt := matcher(n, label)
					if mt == nil || mt.Type != labels.MatchRegexp || mt.Value != "$"+v {
						probs = append(probs, name+": want "+label+`=~"$`+v+`"`)
					}
				}
			}
		case *parser.AggregateExpr:
			// sum by (le, ...) over _bucket series must keep le.
			if vs := innerSelector(n.Expr); vs != nil && strings.HasSuffix(vs.Name, "_bucket") &&
				(n.Without || !slices.Contains(n.Grouping, "le")) {
				probs = append(probs, n.String()+": classic buckets need by (le, ...)")
			}
		}
		return nil
	})
	for name, clean := range fallbackOnly {
		if read[name] && !read[clean] {
			probs = append(probs, name+" without "+clean+": read the clean counter first, this one as its fallback")
		}
	}
	for h := range hasNative {
		if !hasClassic[h] {
			probs = append(probs, h+": native quantile without the classic _bucket fallback")
		}
	}
	for h := range hasClassic {
		if !hasNative[h] {
			probs = append(probs, h+": classic quantile without the native form")
		}
	}
	for h := range hasNativeSum {
		if !hasClassicSum[h] {
			probs = append(probs, h+": native histogram_sum/histogram_count without the classic _sum/_count fallback")
		}
	}
	for h := range hasClassicSum {
		if !hasNativeSum[h] {
			probs = append(probs, h+": classic _sum/_count without the native histogram_sum/histogram_count form")
		}
	}
	return probs
}

// histogramFunc is the name of the innermost histogram_* function call
// among a node's ancestors, or "".
func histogramFunc(path []parser.Node) string {
	for i := len(path) - 1; i >= 0; i-- {
		if c, ok := path[i].(*parser.Call); ok && strings.HasPrefix(c.Func.Name, "histogram_") {
			return c.Func.Name
		}
	}
	return ""
}

// innerSelector is the vector selector under rate(...) of e, if e is that.
func innerSelector(e parser.Expr) *parser.VectorSelector {
	for {
		switch x := e.(type) {
		case *parser.ParenExpr:
			e = x.Expr
		case *parser.Call:
			if len(x.Args) != 1 {
				return nil
			}
			e = x.Args[0]
		case *parser.MatrixSelector:
			e = x.VectorSelector
		case *parser.VectorSelector:
			return x
		default:
			return nil
		}
	}
}

// recordName is level:metric:operations, aggregated by (workload, target),
// or by target alone for what is of an engine (cache.reconcile).
var recordName = regexp.MustCompile(`^(workload_target|target):kvload_[a-z0-9_]+:[a-z0-9_]+$`)

// hasSubquery says whether expr decides over a window of its own
// evaluations (a subquery such as sum_over_time((x < bool 1)[12m:1m])).
func hasSubquery(expr string) bool {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return false
	}
	found := false
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if _, ok := n.(*parser.SubqueryExpr); ok {
			found = true
		}
		return nil
	})
	return found
}

// markdownAnchors are the GitHub anchors of a Markdown file's headings.
func markdownAnchors(md string) map[string]bool {
	out := map[string]bool{}
	strip := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(strip.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		out[a] = true
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func knownName(name string) bool {
	_, _, ok := lookup(name)
	return ok
}

const (
	counter metricKind = iota
	gauge
	histogram
)

const (
	workloadTarget scope = iota // labels workload and target
	workloadOnly
	targetOnly
	exporterWide // no labels of its own
	engine       // an inference engine's own metric
)
