package dashtest

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

const (
	// engineSliceFrom and engineSliceTo are the lines (1-based, inclusive)
	// of the shared synthetic trace replayed against the real engine: its
	// most prefix-sharing stretch among prompts of up to engineMaxISL
	// tokens (about 58 % of their prompt tokens are a shared prefix within
	// the stretch itself), 201 such rows over 183 s.
	engineSliceFrom = 2777
	engineSliceTo   = 3516
	engineMaxISL    = 4000
)

// engineBinary is a prebuilt file named by env, or a clear failure.
func engineBinary(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		t.Fatalf("%s is not set: run `make test-engines`, which builds the real engines and the model", env)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v (run `make test-engines`)", env, err)
	}
	return p
}

// scrapeFamilies fetches url's /metrics in the text format.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	var parser expfmt.TextParser // the zero value accepts any valid name in this version
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return fams
}

// familySum adds up a family's counter, gauge or untyped values.
func familySum(fams map[string]*dto.MetricFamily, name string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// writeLines copies lines from..to (1-based, inclusive) of src to dst.
func writeLines(t *testing.T, src, dst string, from, to int) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatalf("shared traces missing: %v", err)
	}
	defer in.Close()
	var b strings.Builder
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan() && n <= to; n++ {
		if n >= from {
			b.WriteString(sc.Text() + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, b.String())
}

// startLlamaServer runs the real llama-server on the model at addr with
// its defaults, plus /metrics, one compute thread and any extra flags,
// and returns it once it is healthy. One thread because the llama-server
// tests run side by side (llamaParallel): ggml's threads wait for each
// other by spinning, and two engines of two threads each on two cores
// starve each other.
func startLlamaServer(t *testing.T, dir, name, server, modelFile, addr string, extra ...string) *process {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	args := append([]string{"-m", modelFile, "--host", host, "--port", port, "--metrics", "-t", "1"}, extra...)
	srv := startProcess(t, dir, name, server, args...)
	waitHTTP(t, srv, "http://"+addr+"/health", 2*time.Minute)
	return srv
}

// startExporter writes cfg as dir/kvload.yml and runs the exporter on it;
// it returns the exporter's address once it is ready.
func startExporter(t *testing.T, dir, kvload, cfg string) (string, *process) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "kvload.yml"), cfg)
	addr := freeAddr(t)
	exp := startProcess(t, dir, "exporter", kvload, "--config.file="+filepath.Join(dir, "kvload.yml"), "--web.listen-address="+addr)
	waitHTTP(t, exp, "http://"+addr+"/-/ready", time.Minute)
	return addr, exp
}

// replayOnce runs the exporter on cfg and returns its address once its
// single pass is over: every row sent and finished, or dropped.
func replayOnce(t *testing.T, dir, kvload, cfg string, within time.Duration) string {
	t.Helper()
	addr, exp := startExporter(t, dir, kvload, cfg)
	waitLog(t, exp, filepath.Join(dir, "exporter.log"), "replay finished", within)
	return addr
}

// sumLabel adds up name's series whose label has value: a counter's or a
// gauge's value, a histogram's sum of observations.
func sumLabel(fams map[string]*dto.MetricFamily, name, label, value string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}

// waitLog polls a process's log until it holds want.
func waitLog(t *testing.T, p *process, path, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within) // a hang guard only
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not in %s within %v:\n%s", want, path, within, tail(path, 20))
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v", p.name, p.err)
		case <-time.After(500 * time.Millisecond): // polling interval
		}
	}
}

// startOllama runs `ollama serve` at addr with env and returns it once it
// answers.
func startOllama(t *testing.T, dir, name, ollama, addr string, env []string) *process {
	t.Helper()
	srv := startProcessEnv(t, dir, name, env, ollama, "serve")
	waitHTTP(t, srv, "http://"+addr+"/api/version", 2*time.Minute)
	return srv
}
