package openai

import (
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/tracing"
)

// The span attributes of ours, beside the gen_ai and HTTP conventions'.
const (
	attrOutcome  = attribute.Key("kvload.outcome")  // the request's Outcome, success included
	attrTarget   = attribute.Key("kvload.target")   // the configured target's name
	attrWorkload = attribute.Key("kvload.workload") // the configured workload's name
)

// spanStatic is the span name and the attributes every request of a
// client shares (OpenTelemetry's gen_ai client inference span).
func spanStatic(cfg TargetConfig, api API, dialect engine.Dialect, endpoint string) (string, []attribute.KeyValue) {
	op := semconv.GenAIOperationNameChat
	if api == APICompletions {
		op = semconv.GenAIOperationNameTextCompletion
	}
	attrs := []attribute.KeyValue{
		op,
		// The engine behind the OpenAI-compatible API is the provider
		// that answers: vllm, sglang, llama.cpp, ... (openai where the
		// dialect is plain OpenAI).
		semconv.GenAIProviderNameKey.String(string(dialect)),
		semconv.GenAIRequestStream(true),
		attrTarget.String(cfg.Name),
	}
	if cfg.Workload != "" {
		attrs = append(attrs, attrWorkload.String(cfg.Workload))
	}
	name := op.Value.AsString()
	if cfg.Model != "" {
		attrs = append(attrs, semconv.GenAIRequestModel(cfg.Model))
		name += " " + cfg.Model
	}
	if u, err := url.Parse(endpoint); err == nil && u.Hostname() != "" {
		attrs = append(attrs, semconv.ServerAddress(u.Hostname()))
		port, err := strconv.Atoi(u.Port())
		if err != nil { // no port in the URL: the scheme's
			port = 80
			if u.Scheme == "https" {
				port = 443
			}
		}
		attrs = append(attrs, semconv.ServerPort(port))
	}
	return name, attrs
}

func (c *Client) currentTracer() *tracing.Tracer {
	if c.tracer == nil {
		return tracing.DefaultTracer()
	}
	return c.tracer.Load()
}

// endSpan ends the request's span, where it is exported, with what the
// request measured: the gen_ai usage and time to first chunk, and the
// outcome (error.type on a failure).
func (c *Client) endSpan(span tracing.Span, req *Request, res *Response) {
	if !span.Recording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, len(c.spanAttrs)+8)
	attrs = append(attrs, c.spanAttrs...)
	attrs = append(attrs, attrOutcome.String(string(res.Outcome)))
	if req.MaxTokens > 0 {
		attrs = append(attrs, semconv.GenAIRequestMaxTokens(req.MaxTokens))
	}
	if res.HTTPStatus != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(res.HTTPStatus))
	}
	if res.PromptKnown {
		attrs = append(attrs, semconv.GenAIUsageInputTokens(res.PromptTokens))
	}
	if res.OutputTokens > 0 || res.Outcome == OutcomeSuccess {
		attrs = append(attrs, semconv.GenAIUsageOutputTokens(res.OutputTokens))
	}
	if res.CachedKnown {
		attrs = append(attrs, semconv.GenAIUsageCacheReadInputTokens(res.CachedTokens))
	}
	if ttft, ok := res.TTFT(); ok {
		attrs = append(attrs, semconv.GenAIResponseTimeToFirstChunk(ttft.Seconds()))
	}
	failure := ""
	if res.Outcome != OutcomeSuccess {
		failure = string(res.Outcome)
	}
	span.End(attrs, failure, res.Error)
}
