package e2e

// The bad input catalogue: malformed traces and configurations, each of
// which must be refused with one clear error naming the file and line (a
// trace) or the YAML path (a configuration), by --config.check, at start-up
// (exit 2) and on reload (500, the old workload keeps running).

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
)

var updateBadInput = flag.Bool("update-badinput", false, "rewrite the testdata/badinput golden files")

const badInputDir = "testdata/badinput"

// badInputConfig is the configuration the trace cases run with, and the good
// one every reload starts from. ${URL} is the server's address.
const badInputConfig = `targets:
  - name: t
    url: ${URL}
    model: m
    dialect: vllm
workloads:
  - name: w
    trace: trace.jsonl
    targets: [t]
    block_size: 16
`

// badInputGoodTrace replays for ever at a gentle pace (one pass in 300 ms).
const badInputGoodTrace = `{"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]}
{"timestamp": 100, "input_length": 20, "output_length": 2, "hash_ids": [4, 5]}
{"timestamp": 200, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 6]}
`

// checkExitCode is what --config.check returns for a bad file: bad input,
// as a normal start with it returns (shared/docs/contract.md, README).
const checkExitCode = cli.ExitBadInput

// badCase is one bad input. Its file in testdata/badinput replaces
// $DIR/trace.jsonl (a .jsonl) or $DIR/kvload.yml (a .yml); make, when set,
// builds the input instead. The expected error is NAME.golden, with $DIR for
// the temporary directory.
type badCase struct {
	name  string
	where string // what the error must name
	make  func(t *testing.T, dir string)
	// needsNonRoot skips the case as root, who reads any file.
	needsNonRoot bool
}

func badInputCases() []badCase {
	trace := func(line int) string { return fmt.Sprintf("$DIR/trace.jsonl:%d: ", line) }
	const cfg = "$DIR/kvload.yml: "
	return []badCase{
		{name: "truncated-json.jsonl", where: trace(3)},
		{name: "wrong-type-timestamp.jsonl", where: trace(2)},
		{name: "wrong-type-input-length.jsonl", where: trace(2)},
		{name: "wrong-type-hash-ids.jsonl", where: trace(2)},
		{name: "wrong-type-value-echo.jsonl", where: trace(2)},
		{name: "not-an-object.jsonl", where: trace(2)},
		{name: "trailing-garbage.jsonl", where: trace(2)},
		{name: "huge-float-1e400.jsonl", where: trace(2)},
		{name: "huge-int-2pow70.jsonl", where: trace(2)},
		{name: "huge-hash-id.jsonl", where: trace(2)},
		{name: "insane-input-length.jsonl", where: trace(17)},
		{name: "insane-output-length.jsonl", where: trace(3)},
		{name: "negative-timestamp.jsonl", where: trace(2)},
		{name: "negative-input-length.jsonl", where: trace(2)},
		{name: "negative-hash-id.jsonl", where: trace(2)},
		{name: "float-input-length.jsonl", where: trace(2)},
		{name: "nan-timestamp.jsonl", where: trace(2)},
		{name: "nul-byte.jsonl", where: trace(2)},
		{name: "invalid-utf8.jsonl", where: trace(2)},
		{name: "empty.jsonl", where: "$DIR/trace.jsonl: trace has no rows"},
		{name: "only-blank-lines.jsonl", where: "$DIR/trace.jsonl: trace has no rows"},
		{name: "crlf.jsonl", where: trace(4)},
		{name: "bom.jsonl", where: trace(1)},
		{name: "hash-ids-do-not-fit.jsonl", where: trace(2)},
		{name: "no-input.jsonl", where: trace(2)},
		{name: "missing-timestamp.jsonl", where: trace(2)},
		{name: "huge-line-10mb", where: trace(2), make: func(t *testing.T, dir string) {
			// 10 MB of digits in one number, generated rather than committed.
			var b bytes.Buffer
			b.WriteString(badInputGoodTrace[:strings.IndexByte(badInputGoodTrace, '\n')+1])
			b.WriteString(`{"timestamp": 100, "input_length": 1`)
			b.Write(bytes.Repeat([]byte{'9'}, 10<<20))
			b.WriteString(`, "output_length": 3}` + "\n")
			writeBytes(t, filepath.Join(dir, "trace.jsonl"), b.Bytes())
		}},
		{name: "trace-is-directory", where: `$DIR/kvload.yml: workloads[0].trace (line 8): "trace.jsonl": is a directory, not a regular file`, make: func(t *testing.T, dir string) {
			replaceWith(t, filepath.Join(dir, "trace.jsonl"), func(p string) error { return os.Mkdir(p, 0o755) })
		}},
		{name: "trace-is-fifo", where: `$DIR/kvload.yml: workloads[0].trace (line 8): "trace.jsonl": is a named pipe`, make: func(t *testing.T, dir string) {
			// Opening a FIFO without a writer blocks: the reader must not try.
			replaceWith(t, filepath.Join(dir, "trace.jsonl"), func(p string) error { return syscall.Mkfifo(p, 0o644) })
		}},
		{name: "trace-symlink-loop", where: `"trace.jsonl": too many levels of symbolic links (a relative trace path resolves against the configuration file's directory, $DIR)`, make: func(t *testing.T, dir string) {
			replaceWith(t, filepath.Join(dir, "trace.jsonl"), func(p string) error { return os.Symlink("trace.jsonl", p) })
		}},
		{name: "trace-unreadable", where: `"trace.jsonl": permission denied`, needsNonRoot: true, make: func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Join(dir, "trace.jsonl"), 0); err != nil {
				t.Fatal(err)
			}
		}},

		{name: "config-truncated.yml", where: cfg + "invalid YAML: line 7: did not find expected ',' or '}'"},
		{name: "config-wrong-types.yml", where: cfg + "workloads[0].targets: "},
		{name: "config-huge-numbers.yml", where: cfg + "workloads[0].seed: "},
		{name: "config-negative-numbers.yml", where: cfg + "workloads[0].block_size: "},
		{name: "config-duplicate-names.yml", where: cfg + `workloads[1].name: duplicate workload name "w"`},
		{name: "config-duplicate-keys.yml", where: cfg + "workloads[0].block_size: "},
		{name: "config-unknown-keys.yml", where: cfg + `targets[0]: unknown key "cahce" (line 6); did you mean "cache"?`},
		{name: "config-unknown-target.yml", where: cfg + `workloads[1].targets[0]: unknown target "vllm-b"`},
		{name: "config-nul-byte.yml", where: cfg + "line 11: "},
		{name: "config-invalid-utf8.yml", where: cfg + "line 11: "},
		{name: "config-top-level-list.yml", where: cfg + "line 1: "},
		{name: "config-two-documents.yml", where: cfg + "more than one YAML document"},
		{name: "config-empty.yml", where: cfg + "targets: "},
		{name: "config-only-comments.yml", where: cfg + "workloads: "},
		{name: "config-alias-bomb.yml", where: cfg + "invalid YAML: yaml: document contains excessive aliasing"},
		{name: "config-http-client-conflict.yml", where: cfg + "targets[0].http_client_config: "},
		{name: "config-tls-file-missing.yml", where: cfg + "targets[0].http_client_config: "},
		{name: "config-extra-body-stream.yml", where: cfg + "targets[0].extra_body.stream: "},
		{name: "config-bom-crlf.yml", where: cfg + `workloads[0].loop: "forever"`},
		{name: "config-trace-missing.yml", where: `$DIR/kvload.yml: workloads[0].trace (line 8): "no-such-trace.jsonl": no such file or directory (a relative trace path resolves against the configuration file's directory, $DIR)`},
		{name: "config-trace-empty-path.yml", where: cfg + "workloads[0].trace: is required"},
		{name: "config-missing", where: "$DIR/kvload.yml: no such file or directory", make: func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "kvload.yml")); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "config-is-directory", where: "$DIR/kvload.yml: is a directory", make: func(t *testing.T, dir string) {
			replaceWith(t, filepath.Join(dir, "kvload.yml"), func(p string) error { return os.Mkdir(p, 0o755) })
		}},
		{name: "config-symlink-loop", where: "$DIR/kvload.yml: too many levels of symbolic links", make: func(t *testing.T, dir string) {
			replaceWith(t, filepath.Join(dir, "kvload.yml"), func(p string) error { return os.Symlink("kvload.yml", p) })
		}},
		{name: "config-unreadable", where: "$DIR/kvload.yml: permission denied", needsNonRoot: true, make: func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Join(dir, "kvload.yml"), 0); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

func writeBytes(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// replaceWith removes path and creates something else there.
func replaceWith(t *testing.T, path string, create func(string) error) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := create(path); err != nil {
		t.Fatal(err)
	}
}

// writeGoodInput writes the good configuration and trace into dir.
func writeGoodInput(t *testing.T, dir, url string) {
	t.Helper()
	writeBytes(t, filepath.Join(dir, "kvload.yml"), []byte(strings.ReplaceAll(badInputConfig, "${URL}", url)))
	writeBytes(t, filepath.Join(dir, "trace.jsonl"), []byte(badInputGoodTrace))
}

// breakInput replaces the good input in dir with the case's bad one.
func breakInput(t *testing.T, dir, url string, c badCase) {
	t.Helper()
	if c.make != nil {
		c.make(t, dir)
		return
	}
	data, err := os.ReadFile(filepath.Join(badInputDir, c.name))
	if err != nil {
		t.Fatal(err)
	}
	switch filepath.Ext(c.name) {
	case ".jsonl":
		writeBytes(t, filepath.Join(dir, "trace.jsonl"), data)
	case ".yml":
		data = bytes.ReplaceAll(data, []byte("${URL}"), []byte(url))
		writeBytes(t, filepath.Join(dir, "kvload.yml"), data)
	default:
		t.Fatalf("case %s: neither a .jsonl nor a .yml file", c.name)
	}
}

// goldenName is the case's golden file: its name without the extension.
func goldenName(c badCase) string {
	return filepath.Join(badInputDir, strings.TrimSuffix(c.name, filepath.Ext(c.name))+".golden")
}

// wantError reads the case's golden error; with write (the check test
// under -update-badinput) it first rewrites it from got.
func wantError(t *testing.T, c badCase, got string, write bool) string {
	t.Helper()
	path := goldenName(c)
	if write {
		writeBytes(t, path, []byte(got+"\n"))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/e2e -run TestBadInputCheck -update-badinput)", err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

// checkClear asserts what every error of the catalogue must be: it names
// the case's place, every line names a file of the test, and it is short
// text, not a stack or a dump of the input.
func checkClear(t *testing.T, c badCase, msg string) {
	t.Helper()
	if !strings.Contains(msg, c.where) {
		t.Errorf("error does not name %q:\n%s", c.where, msg)
	}
	for _, line := range strings.Split(msg, "\n") {
		if !strings.Contains(line, "$DIR/") {
			t.Errorf("error line names no file: %q", line)
		}
		if len(line) > 300 {
			t.Errorf("error line of %d bytes: %.300q…", len(line), line)
		}
	}
	for _, bad := range []string{"goroutine ", "panic", "\r", "\x00", "s3cr3t", "&{"} {
		if strings.Contains(msg, bad) {
			t.Errorf("error holds %q:\n%s", bad, msg)
		}
	}
}

// TestBadInputCatalogue checks that the catalogue and its files agree: no
// case without its input or golden file, no file without its case.
func TestBadInputCatalogue(t *testing.T) {
	t.Parallel()
	want := map[string]bool{}
	for _, c := range badInputCases() {
		if c.make == nil {
			want[c.name] = true
		}
		want[filepath.Base(goldenName(c))] = true
	}
	if len(badInputCases()) < 30 {
		t.Errorf("only %d cases", len(badInputCases()))
	}
	entries, err := os.ReadDir(badInputDir)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
		if !want[e.Name()] && e.Name() != "README.md" {
			t.Errorf("%s/%s belongs to no case", badInputDir, e.Name())
		}
	}
	var missing []string
	for name := range want {
		if !have[name] && !*updateBadInput {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("files of the catalogue missing from %s: %v", badInputDir, missing)
	}
}

// TestBadInputCheck runs --config.check on every case: exit 2 and the
// golden error on stdout. It also writes the golden files.
func TestBadInputCheck(t *testing.T) {
	t.Parallel()
	for _, c := range badInputCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := brokenInput(t, c)
			var stdout, stderr testutil.Buffer
			code := runWithin(t, []string{"--config.file=" + filepath.Join(dir, "kvload.yml"), "--config.check"}, &stdout, &stderr)
			if code != checkExitCode {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, checkExitCode, stdout.String(), stderr.String())
			}
			got := strings.ReplaceAll(strings.TrimSuffix(stdout.String(), "\n"), dir, "$DIR")
			checkClear(t, c, got)
			if want := wantError(t, c, got, *updateBadInput); got != want {
				t.Errorf("error differs from %s:\n got: %s\nwant: %s", goldenName(c), got, want)
			}
		})
	}
}

// TestBadInputStart starts the daemon on every case: it must not start,
// exit 2, and print the golden error last.
func TestBadInputStart(t *testing.T) {
	t.Parallel()
	for _, c := range badInputCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := brokenInput(t, c)
			var stdout, stderr testutil.Buffer
			code := runWithin(t, []string{"--config.file=" + filepath.Join(dir, "kvload.yml"), "--web.listen-address=127.0.0.1:0"}, &stdout, &stderr)
			if code != cli.ExitBadInput {
				t.Errorf("exit code %d, want %d\nstderr:\n%s", code, cli.ExitBadInput, stderr.String())
			}
			out := strings.ReplaceAll(stderr.String(), dir, "$DIR")
			_, got, ok := strings.Cut(out, "\n"+cli.ProgramName+": ")
			if !ok {
				t.Fatalf("no %q error line in stderr:\n%s", cli.ProgramName+": ", out)
			}
			got = strings.TrimSuffix(got, "\n")
			want := wantError(t, c, got, false)
			if got != want {
				t.Errorf("error differs from %s:\n got: %s\nwant: %s", goldenName(c), got, want)
			}
			// Printed once: not also as a log line (whose quoting would
			// differ, so the place it names is what is counted).
			if n := strings.Count(out, c.where); n != 1 {
				t.Errorf("%q printed %d times:\n%s", c.where, n, out)
			}
		})
	}
}

// TestBadInputReload runs the daemon on a good configuration, breaks its
// input with every case and reloads through POST /-/reload: 500 with the
// golden error, and the reload gauge at 0 in /metrics. That the running
// set is left alone is lifecycle.TestBadReloadKeepsRunning.
func TestBadInputReload(t *testing.T) {
	t.Parallel()
	for _, c := range badInputCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			skipAsRoot(t, c)
			srv := testutil.NewFakeServer(t, nil)
			dir := t.TempDir()
			writeGoodInput(t, dir, srv.URL)
			d := startDaemon(t, "--config.file="+filepath.Join(dir, "kvload.yml"))
			testutil.Eventually(t, "the good workload replaying", func() (bool, string) {
				n, _ := testutil.Scrape(t, d.url).Value("kvload_requests_total", "workload", "w", "target", "t", "outcome", "success")
				return n > 0, fmt.Sprint(n)
			})

			breakInput(t, dir, srv.URL, c)
			code, body := postReload(t, d.url)
			if code != http.StatusInternalServerError {
				t.Errorf("POST /-/reload: %d, want 500:\n%s", code, body)
			}
			got := strings.ReplaceAll(strings.TrimSpace(body), dir, "$DIR")
			got = strings.TrimPrefix(got, "failed to reload config:\n")
			if want := wantError(t, c, got, false); got != want {
				t.Errorf("reload error differs from %s:\n got: %s\nwant: %s", goldenName(c), got, want)
			}
			if v, n := testutil.Scrape(t, d.url).Value("kvload_config_last_reload_successful"); v != 0 || n != 1 {
				t.Errorf("kvload_config_last_reload_successful %v (%d series), want 0", v, n)
			}
		})
	}
}

// brokenInput writes a good configuration and trace into a new directory,
// breaks them as c says and returns the directory. The target's address is
// a closed port: start-up and --config.check never reach it.
func brokenInput(t *testing.T, c badCase) string {
	t.Helper()
	skipAsRoot(t, c)
	dir := t.TempDir()
	writeGoodInput(t, dir, "http://127.0.0.1:9")
	breakInput(t, dir, "http://127.0.0.1:9", c)
	return dir
}

func skipAsRoot(t *testing.T, c badCase) {
	t.Helper()
	if c.needsNonRoot && os.Geteuid() == 0 {
		t.Skip("running as root, who can read a file with mode 000: TestBadInputUnreadableAsRoot runs this case as nobody")
	}
}

// runWithin runs the program like main and returns its exit code; a run
// that does not return (a bad input accepted, or a hang) fails the test
// when the kit's wait runs out.
func runWithin(t *testing.T, args []string, stdout, stderr io.Writer) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- cli.Run(ctx, args, stdout, stderr) }()
	return testutil.Wait(t, fmt.Sprintf("the end of %v (still running: the input was accepted, or it hangs)", args), done)
}
