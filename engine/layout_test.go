package engine

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// vLLM 0.11's line, as its /metrics prints it.
const vllmInfo = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="0",num_gpu_blocks="27484",prefix_caching_hash_algo="sha256"} 1.0
`

func TestReadLayout(t *testing.T) {
	tests := []struct {
		name    string
		dialect Dialect
		path    string
		body    string
		want    Layout
		err     string
	}{
		{"vllm", "vllm", "/metrics", vllmInfo, Layout{BlockSize: 16, Blocks: 27484, Source: "vllm:cache_config_info"}, ""},
		{"vllm without the gauge", "vllm", "/metrics", "# TYPE x counter\nx 1\n", Layout{}, "not found"},
		{"vllm with a bad label", "vllm", "/metrics", `vllm:cache_config_info{block_size="16",num_gpu_blocks="many"} 1` + "\n", Layout{}, "not usable"},
		{"vllm garbage", "vllm", "/metrics", "vllm:cache_config_info{not metrics", Layout{}, "vllm metrics"},
		{"sglang", "sglang", "/get_server_info", `{"max_total_num_tokens": 831234, "page_size": 1, "other": [1]}`, Layout{BlockSize: 1, Blocks: 831234, Source: "/get_server_info"}, ""},
		{"sglang pages of 64", "sglang", "/get_server_info", `{"max_total_num_tokens": 6400, "page_size": 64}`, Layout{BlockSize: 64, Blocks: 100, Source: "/get_server_info"}, ""},
		{"sglang without the size", "sglang", "/get_server_info", `{"page_size": 1}`, Layout{}, "no max_total_num_tokens"},
		{"trtllm exposes nothing", "trtllm", "/", "", Layout{}, ErrNotExposed.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != tt.path {
					http.NotFound(w, r)
					return
				}
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			got, err := For(tt.dialect).ReadLayout(context.Background(), srv.Client(), srv.URL+"/")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ReadLayout = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestReadLayoutHTTPError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nope", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	_, err := For(DialectVLLM).ReadLayout(context.Background(), srv.Client(), srv.URL)
	if err == nil || !strings.Contains(err.Error(), "HTTP 503") || errors.Is(err, ErrNotExposed) {
		t.Fatalf("error %v, want HTTP 503", err)
	}
}

// FuzzParse: no answer makes the parsers panic or return an unusable layout.
func FuzzParseLayout(f *testing.F) {
	f.Add([]byte(vllmInfo))
	f.Add([]byte(`{"max_total_num_tokens": 10, "page_size": 0}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) (Layout, error){parseVLLMLayout, parseSGLangLayout} {
			if l, err := parse(body); err == nil && (l.BlockSize < 1 || l.Blocks < 0) {
				t.Fatalf("accepted %+v", l)
			}
		}
	})
}

// LayoutFailureOf tells a target that is down or slow from one that answers
// without a usable layout, on the errors real reads return.
func TestLayoutFailureOf(t *testing.T) {
	// An address where nothing listens: a listener closed at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow/metrics":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/cut/metrics":
			w.Header().Set("Content-Length", "1000")
			w.Write([]byte("vllm:cache_config_info"))
		case "/moved/metrics":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case "/down/metrics":
			http.Error(w, "loading", http.StatusServiceUnavailable)
		default:
			w.Write([]byte("# TYPE x counter\nx 1\n"))
		}
	}))
	defer srv.Close()
	for _, tt := range []struct {
		name, base string
		want       LayoutFailure
	}{
		{"nothing listens", down, LayoutUnreachable},
		{"no answer in time", srv.URL + "/slow", LayoutTimeout},
		{"answer cut short", srv.URL + "/cut", LayoutUnreachable},
		{"redirect", srv.URL + "/moved", LayoutBadAnswer},
		{"error status", srv.URL + "/down", LayoutBadAnswer},
		{"no gauge", srv.URL + "/plain", LayoutBadAnswer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := srv.Client()
			NoRedirects(c)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := For(DialectVLLM).ReadLayout(ctx, c, tt.base)
			if err == nil {
				t.Fatal("read succeeded")
			}
			if got := LayoutFailureOf(err); got != tt.want {
				t.Errorf("LayoutFailureOf(%v) = %s, want %s", err, got, tt.want)
			}
		})
	}
}
