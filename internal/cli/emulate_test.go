package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// The emulate command serves until its context ends and exits 0; the
// first stderr line carries the URL.
func TestEmulateCommandServes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var out bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"emulate", "--listen", "127.0.0.1:0", "--model", "tiny",
			"--block-size", "4", "--overhead", "0s", "--prefill-per-token", "0s", "--inter-token", "0s"},
			streams{stdout: &out, stderr: pw})
		pw.Close()
	}()

	br := bufio.NewReader(pr)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading stderr: %v", err)
	}
	m := regexp.MustCompile(`url=(http://\S+)`).FindStringSubmatch(first)
	if m == nil {
		t.Fatalf("no url in %q", first)
	}
	rest := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(br)
		rest <- string(b)
	}()

	body := `{"model": "tiny", "prompt": [1,2,3,4,5,6,7,8,9], "max_tokens": 3}`
	var cached []int
	for range 2 {
		resp, err := http.Post(m[1]+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Usage struct {
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || c.Usage.CompletionTokens != 3 {
			t.Fatalf("status %d, usage %+v, %v", resp.StatusCode, c.Usage, err)
		}
		cached = append(cached, c.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] != 8 {
		t.Fatalf("cached tokens %v, want [0 8] with 4-token blocks", cached)
	}

	cancel()
	if c := <-code; c != exitOK {
		t.Fatalf("exit code %d", c)
	}
	if tail := <-rest; !strings.Contains(tail, "emulator stopped") || !strings.Contains(tail, "success=2") {
		t.Fatalf("stderr after start: %q", tail)
	}
}

func TestEmulateCommandBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"negative block size", []string{"--block-size", "-1"}},
		{"probability above one", []string{"--error-rate", "1.5"}},
		{"probabilities above one together", []string{"--error-rate", "0.6", "--hang-rate", "0.6"}},
		{"bad duration", []string{"--inter-token", "fast"}},
		{"negative capacity", []string{"--capacity-blocks", "-2"}},
		{"host prompt cache without llamacpp", []string{"--cache-ram-tokens", "100"}},
		{"host prompt cache below -1", []string{"--engine", "llamacpp", "--cache-ram-tokens=-2"}},
		{"hidden capacity on llamacpp", []string{"--engine", "llamacpp", "--hide-cache-config"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"emulate", "--listen", "127.0.0.1:0"}, tt.args...)
			if code := run(context.Background(), args, streams{stdout: &out, stderr: &errOut}); code != exitBadInput {
				t.Fatalf("exit code %d, want %d; stderr %s", code, exitBadInput, errOut.String())
			}
		})
	}
}

func TestEmulateCommandListenError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tt := range []struct{ name, listen, want string }{
		{"bad address", "256.0.0.1:bad", programName + ": emulate: listen tcp: "},
		{"port taken", taken.Addr().String(), programName + ": emulate: listen tcp " + taken.Addr().String() + ": bind: address already in use\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), []string{"emulate", "--listen", tt.listen}, streams{stdout: &out, stderr: &errOut})
			if code != exitBadInput {
				t.Fatalf("exit code %d, want %d as the daemon's; stderr %s", code, exitBadInput, errOut.String())
			}
			if got := errOut.String(); !strings.HasPrefix(got, tt.want) || strings.Count(got, "emulate:") != 1 {
				t.Errorf("stderr %q, want it to start %q with one \"emulate:\"", got, tt.want)
			}
		})
	}
}

// The host prompt cache and hidden-capacity flags reach the emulator.
func TestEmulateCommandCacheFlags(t *testing.T) {
	for _, tt := range []struct {
		name  string
		args  []string
		log   string // in the first stderr line
		path  string // fetched; its body must hold want and not avoid
		want  string
		avoid string
	}{
		{"host prompt cache", []string{"--engine", "llamacpp", "--cache-ram-tokens", "500"}, "cache_ram_tokens=500",
			"/emulator/stats", `"cache_ram_tokens":500`, ""},
		{"host prompt cache by default", []string{"--engine", "llamacpp"}, "cache_ram_tokens=65536",
			"/emulator/stats", `"cache_ram_tokens":65536`, ""},
		{"host prompt cache off", []string{"--engine", "llamacpp", "--cache-ram-tokens=-1"}, "cache_ram_tokens=-1",
			"/emulator/stats", `"blocks"`, "cache_ram_tokens"},
		{"capacity shown", []string{"--capacity-blocks", "64"}, "capacity_blocks=64",
			"/metrics", `num_gpu_blocks="64"`, ""},
		{"capacity hidden", []string{"--capacity-blocks", "64", "--hide-cache-config"}, "capacity_blocks=64",
			"/metrics", "vllm:prefix_cache_hits_total", "vllm:cache_config_info"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pr, pw := io.Pipe()
			code := make(chan int, 1)
			go func() {
				code <- run(ctx, append([]string{"emulate", "--listen", "127.0.0.1:0"}, tt.args...), streams{stdout: io.Discard, stderr: pw})
				pw.Close()
			}()
			br := bufio.NewReader(pr)
			first, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("reading stderr: %v", err)
			}
			go func() { _, _ = io.Copy(io.Discard, br) }()
			m := regexp.MustCompile(`url=(http://\S+)`).FindStringSubmatch(first)
			if m == nil || !strings.Contains(first, " "+tt.log+" ") {
				t.Fatalf("first line %q, want a url and %s", first, tt.log)
			}
			resp, err := http.Get(m[1] + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.Contains(string(body), tt.want) || (tt.avoid != "" && strings.Contains(string(body), tt.avoid)) {
				t.Fatalf("GET %s: %v\n%s\nwant %q, not %q", tt.path, err, body, tt.want, tt.avoid)
			}
			cancel()
			if c := <-code; c != exitOK {
				t.Fatalf("exit code %d", c)
			}
		})
	}
}
