package collector

import "github.com/prometheus/client_golang/prometheus"

// TemplateSource is where the size of a target's chat template, which
// chat prompts leave room for, was found: the source label of
// kvload_chat_template_tokens.
type TemplateSource string

// The sources of a chat template's size.
const (
	// TemplateFromTokenize: measured through the target's tokenize
	// endpoint, and not contradicted by its answers.
	TemplateFromTokenize TemplateSource = "tokenize"
	// TemplateFromAnswers: learnt from the answers' prompt_tokens, where
	// the endpoint could not measure it or measured another size.
	TemplateFromAnswers TemplateSource = "answers"
)

// ChatTemplate is the collector's part for the chat template's size per
// (workload, target) and the times the answers corrected the measured one.
type ChatTemplate struct {
	tokens      *prometheus.GaugeVec
	corrections *prometheus.CounterVec
}

func newChatTemplate() *ChatTemplate {
	wt := []string{"workload", "target"}
	return &ChatTemplate{
		tokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "chat_template_tokens",
			Help: "Tokens the target's chat template adds to a prompt, which chat prompts leave room for, by where the size was found: tokenize (its tokenize endpoint), answers (the answers' prompt_tokens); absent until known."},
			append(wt, "source")),
		corrections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "chat_template_corrections_total",
			Help: "Chat template sizes measured through the target's tokenize endpoint that its first answers' prompt_tokens contradicted, and that were replaced by theirs."},
			wt),
	}
}

func (m *ChatTemplate) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.tokens, m.corrections}
}

func (m *ChatTemplate) forget(l prometheus.Labels) {
	m.tokens.DeletePartialMatch(l)
	m.corrections.DeletePartialMatch(l)
}

// Start creates the corrections counter of a (workload, target) whose
// chat prompts leave room for a template, at zero.
func (m *ChatTemplate) Start(workload, target string) {
	m.corrections.WithLabelValues(workload, target)
}

// Set publishes the size of the chat template a (workload,
// target)'s prompts leave room for, and where it was found, replacing
// what was published before.
func (m *ChatTemplate) Set(workload, target string, tokens int, source TemplateSource) {
	m.tokens.DeletePartialMatch(prometheus.Labels{"workload": workload, "target": target})
	m.tokens.WithLabelValues(workload, target, string(source)).Set(float64(tokens))
}

// Corrected counts a measured template size that the answers replaced.
func (m *ChatTemplate) Corrected(workload, target string) {
	m.corrections.WithLabelValues(workload, target).Inc()
}
