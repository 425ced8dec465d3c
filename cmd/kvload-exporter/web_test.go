package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvload-exporter/kvload-exporter/collector"
)

func testMux(ready bool, reloadErr error) *http.ServeMux {
	reg := prometheus.NewRegistry()
	c := collector.New(reg)
	c.SetTarget("t<script>", "m", "chat", "vllm", "usage")
	return newMux(webDeps{
		gatherer:      reg,
		telemetryPath: "/metrics",
		ready:         func() bool { return ready },
		reload:        func(context.Context) error { return reloadErr },
		landing: func() landingData {
			return landingData{
				ConfigFile:  "kvload.yml",
				ReloadError: `workloads[0].name: "<b>x</b>" may hold only letters`,
				LastReload:  time.Unix(0, 0),
				Targets:     []landingTarget{{Name: "<img src=x>", Model: "m", API: "chat", Dialect: "vllm"}},
				Rows:        []collector.Status{{Workload: "<w>", Target: "t", RequestsPerSec: 2, TTFTP50: 3 * time.Millisecond}},
			}
		},
	})
}

func TestWebEndpoints(t *testing.T) {
	tests := []struct {
		name       string
		mux        *http.ServeMux
		method     string
		path       string
		wantStatus int
		wantBody   string
	}{
		{"healthy", testMux(false, nil), "GET", "/-/healthy", 200, "Healthy"},
		{"not ready", testMux(false, nil), "GET", "/-/ready", 503, "Not ready"},
		{"ready", testMux(true, nil), "GET", "/-/ready", 200, "Ready"},
		{"reload needs POST", testMux(true, nil), "GET", "/-/reload", 405, "POST"},
		{"reload ok", testMux(true, nil), "POST", "/-/reload", 200, "Reloaded"},
		{"reload fails with problems", testMux(true, errors.New("kvload.yml: workloads[1].targets[0]: unknown target \"vlm-a\"")), "POST", "/-/reload", 500, `unknown target "vlm-a"`},
		{"metrics", testMux(true, nil), "GET", "/metrics", 200, "kvload_target_info"},
		{"landing", testMux(true, nil), "GET", "/", 200, "3ms"},
		{"unknown path", testMux(true, nil), "GET", "/nope", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tt.mux.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d (%s)", rec.Code, tt.wantStatus, body)
			}
			if !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("body lacks %q:\n%s", tt.wantBody, body)
			}
		})
	}
}

func TestLandingEscapes(t *testing.T) {
	rec := httptest.NewRecorder()
	testMux(true, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	for _, raw := range []string{"<script>", "<img src=x>", "<b>x</b>", "<w>"} {
		if strings.Contains(body, raw) {
			t.Errorf("landing page holds unescaped %q", raw)
		}
	}
	if !strings.Contains(body, "&lt;img src=x&gt;") {
		t.Errorf("escaped target name missing:\n%s", body)
	}
}
