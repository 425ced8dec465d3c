package cli

import (
	"bytes"
	"strings"
	"testing"
)

func TestSlogBridge(t *testing.T) {
	tests := []struct {
		name   string
		flags  logFlags
		log    func(buf *bytes.Buffer, f logFlags)
		want   []string
		absent []string
	}{
		{"info passes, debug filtered", logFlags{"info", "logfmt"}, func(buf *bytes.Buffer, f logFlags) {
			_, l, minLevel, err := newLogger(f, buf)
			if err != nil {
				t.Fatal(err)
			}
			s := newSlogBridge(l, minLevel)
			s.Debug("hidden")
			s.With("listen", ":9812").WithGroup("tls").Info("Listening on", "enabled", false)
		}, []string{"level=info", `msg="Listening on"`, "listen=:9812", "tls.enabled=false", "ts=20", "caller=logging_test.go:"}, []string{"hidden", "time="}},
		{"json with error level", logFlags{"error", "json"}, func(buf *bytes.Buffer, f logFlags) {
			_, l, minLevel, err := newLogger(f, buf)
			if err != nil {
				t.Fatal(err)
			}
			s := newSlogBridge(l, minLevel)
			s.Warn("quiet")
			s.Error("boom", "code", 3)
		}, []string{`"level":"error"`, `"msg":"boom"`, `"code":"3"`}, []string{"quiet"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.log(&buf, tt.flags)
			out := buf.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(out, a) {
					t.Errorf("output has %q:\n%s", a, out)
				}
			}
		})
	}
}

func TestNewLoggerRejectsBadFlags(t *testing.T) {
	for _, f := range []logFlags{{"verbose", "logfmt"}, {"info", "xml"}} {
		if _, _, _, err := newLogger(f, &bytes.Buffer{}); err == nil {
			t.Errorf("newLogger(%+v) accepted", f)
		}
	}
}
