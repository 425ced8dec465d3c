package engine

import (
	"context"
	"errors"
	"io"
	"math/big"
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

// TestReadLayoutTooLarge: an SGLang server info past maxLayoutBody is
// refused as too large, not parsed cut or held whole (it was read up to
// 32 MiB, per target, up to 32 targets at once).
func TestReadLayoutTooLarge(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Valid JSON whatever its length: the size alone is wrong.
		_, _ = io.WriteString(w, `{"max_total_num_tokens": 4096, "page_size": 16, "pad": "`+strings.Repeat("x", maxLayoutBody)+`"}`)
	}))
	defer srv.Close()
	_, err := For(DialectSGLang).ReadLayout(context.Background(), srv.Client(), srv.URL)
	if !errors.Is(err, ErrAnswerTooLarge) || LayoutFailureOf(err) != LayoutBadAnswer {
		t.Fatalf("error %v (%s), want ErrAnswerTooLarge, a bad answer", err, LayoutFailureOf(err))
	}
}

// FuzzParse: no answer makes the parsers panic or return an unusable layout,
// SGLang's none of 0 blocks (which reads as unbounded), and CheckLayout
// passes only layouts within the bounds, their product computed exactly.
func FuzzParseLayout(f *testing.F) {
	f.Add([]byte(vllmInfo))
	f.Add([]byte(`{"max_total_num_tokens": 10, "page_size": 0}`))
	f.Add([]byte(`{"max_total_num_tokens": 10, "page_size": 64}`))
	f.Add([]byte(`vllm:cache_config_info{block_size="1024",num_gpu_blocks="4611686018427387904"} 1` + "\n"))
	f.Add([]byte(`vllm:cache_config_info{block_size="65536",num_gpu_blocks="65536"} 1` + "\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) (Layout, error){parseVLLMLayout, parseSGLangLayout} {
			l, err := parse(body)
			if err != nil {
				continue
			}
			if l.BlockSize < 1 || l.Blocks < 0 {
				t.Fatalf("accepted %+v", l)
			}
			if l.Source == "/get_server_info" && l.Blocks == 0 {
				t.Fatalf("SGLang's %+v reads as unbounded", l)
			}
			tokens := new(big.Int).Mul(big.NewInt(int64(l.Blocks)), big.NewInt(int64(l.BlockSize)))
			within := l.BlockSize <= MaxBlockSize && tokens.Cmp(big.NewInt(MaxCapacityTokens)) <= 0
			if err := CheckLayout(l); (err == nil) != within {
				t.Fatalf("CheckLayout(%+v) = %v, %d tokens", l, err, tokens)
			}
		}
	})
}

// TestReadLayoutPlausible: a layout no server could have is refused,
// naming its values: taken as true, 2^62 blocks of 1,024 tokens overflowed
// the model's arithmetic (it then evicted everything, and its hit rate
// read 0), as did a block size of 2^31; 10^15 blocks made a model that
// never evicts; and an SGLang page larger than its whole pool made 0
// blocks, which reads as unbounded.
func TestReadLayoutPlausible(t *testing.T) {
	vllm := func(blockSize, blocks string) string {
		return `vllm:cache_config_info{block_size="` + blockSize + `",num_gpu_blocks="` + blocks + `"} 1` + "\n"
	}
	tests := []struct {
		name    string
		dialect Dialect
		body    string
		want    Layout
		err     string // "": accepted
	}{
		{"2^62 blocks of 1024", DialectVLLM, vllm("1024", "4611686018427387904"), Layout{}, "4611686018427387904 blocks of 1024 tokens is not from 0 to 4294967296 tokens"},
		{"blocks of 2^31 tokens", DialectVLLM, vllm("2147483648", "100"), Layout{}, "block size 2147483648 is not from 1 to 65536 tokens"},
		{"10^15 blocks", DialectVLLM, vllm("16", "1000000000000000"), Layout{}, "1000000000000000 blocks of 16 tokens"},
		{"2^32 tokens", DialectVLLM, vllm("16", "268435456"), Layout{BlockSize: 16, Blocks: 1 << 28, Source: "vllm:cache_config_info"}, ""},
		{"a block more", DialectVLLM, vllm("16", "268435457"), Layout{}, "268435457 blocks of 16 tokens"},
		{"the largest block", DialectVLLM, vllm("65536", "10"), Layout{BlockSize: 65536, Blocks: 10, Source: "vllm:cache_config_info"}, ""},
		{"an emulator's unbounded cache", DialectVLLM, vllm("16", "0"), Layout{BlockSize: 16, Source: "vllm:cache_config_info"}, ""},
		{"sglang page above the pool", DialectSGLang, `{"max_total_num_tokens": 100, "page_size": 128}`, Layout{}, "page_size 128 is above max_total_num_tokens 100"},
		{"sglang 2^40 tokens", DialectSGLang, `{"max_total_num_tokens": 1099511627776, "page_size": 1}`, Layout{}, "1099511627776 blocks of 1 tokens"},
		{"sglang pages of 2^20", DialectSGLang, `{"max_total_num_tokens": 2097152, "page_size": 1048576}`, Layout{}, "block size 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			got, err := For(tt.dialect).ReadLayout(context.Background(), srv.Client(), srv.URL)
			if tt.err == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ReadLayout = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) || got != (Layout{}) {
				t.Fatalf("ReadLayout = %+v, %v; want an error containing %q", got, err, tt.err)
			}
			if !errors.Is(err, ErrImplausibleLayout) {
				t.Errorf("%v does not wrap ErrImplausibleLayout", err)
			}
			if f := LayoutFailureOf(err); f != LayoutBadAnswer {
				t.Errorf("LayoutFailureOf(%v) = %s, want bad_answer", err, f)
			}
		})
	}
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
			// Only the read that never ends has a deadline to run into: one
			// that a loaded machine made late on another read would fail
			// that read for the wrong reason.
			ctx := context.Background()
			if tt.want == LayoutTimeout {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
			}
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
