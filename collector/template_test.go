package collector

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

// TestChatTemplate: the corrections counter exists at zero once started,
// the size is one series under its latest source, and Forget takes both.
func TestChatTemplate(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(reg)
	tpl := c.ChatTemplate()
	tpl.Start("w", "t")
	m := testutil.Gather(t, reg)
	if v, n := m.Value("kvload_chat_template_corrections_total", "workload", "w", "target", "t"); v != 0 || n != 1 {
		t.Errorf("corrections %v (%d series), want one at 0", v, n)
	}
	if _, n := m.Value("kvload_chat_template_tokens", "workload", "w", "target", "t"); n != 0 {
		t.Errorf("a size before it is known")
	}
	tpl.Set("w", "t", 12, TemplateFromTokenize)
	tpl.Set("w", "t", 17, TemplateFromAnswers)
	tpl.Corrected("w", "t")
	m = testutil.Gather(t, reg)
	if v, n := m.Value("kvload_chat_template_tokens", "workload", "w", "target", "t", "source", string(TemplateFromAnswers)); v != 17 || n != 1 {
		t.Errorf("size %v (%d series), want 17 from the answers", v, n)
	}
	if _, n := m.Value("kvload_chat_template_tokens", "workload", "w", "target", "t"); n != 1 {
		t.Errorf("%d size series, want the latest source's only", n)
	}
	if v, _ := m.Value("kvload_chat_template_corrections_total", "workload", "w", "target", "t"); v != 1 {
		t.Errorf("corrections %v, want 1", v)
	}
	c.Forget("w", "t")
	if left := testutil.Gather(t, reg).SeriesWith("target", "t"); len(left) != 0 {
		t.Errorf("left after Forget: %v", left)
	}
}
