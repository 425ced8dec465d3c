package e2e

// Security hardening: the web server behind TLS and basic auth,
// secrets read from files kept out of every output, a landing page that
// escapes what config files and targets put on it, and bounds on what is
// read from clients and servers.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/html"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/cli"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil"
	"github.com/kvload-exporter/kvload-exporter/internal/testutil/daemontest"
)

// testPKI is a throw-away CA and a server certificate it signed for
// 127.0.0.1, as PEM files.
type testPKI struct {
	certFile, keyFile string
	ca                *x509.Certificate
	pool              *x509.CertPool // holds only the CA
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kvload test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	ca, err := x509.ParseCertificate(caDER)
	must(err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kvload-exporter"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	must(err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	must(err)

	p := testPKI{certFile: filepath.Join(dir, "server.crt"), keyFile: filepath.Join(dir, "server.key"), ca: ca, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	must(os.WriteFile(p.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	must(os.WriteFile(p.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return p
}

// emulatedOnly is a configuration that needs no outside server.
func emulatedOnly(t *testing.T) config.Config {
	return config.Config{
		Targets:   []config.Target{{Name: "demo", Emulate: &config.Emulate{InterToken: time.Millisecond}}},
		Workloads: []config.Workload{daemontest.Workload("w", fixture(t, "tiny.jsonl"), "demo")},
	}
}

// TestSecurityWebConfig runs the daemon with --web.config.file (TLS and
// basic auth): nothing is served over plain HTTP, every endpoint wants the
// password, and the certificate verifies against the test CA only.
func TestSecurityWebConfig(t *testing.T) {
	t.Parallel()
	const user, password = "prometheus", "w3b-pa55-Tq9"
	pki := newTestPKI(t)
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	webConfig := filepath.Join(dir, "web.yml")
	daemontest.WriteFile(t, webConfig, fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n  %s: %s\n",
		pki.certFile, pki.keyFile, user, hash))
	cfg := filepath.Join(dir, "kvload.yml")
	daemontest.WriteConfig(t, cfg, emulatedOnly(t))
	d := startDaemon(t, "--config.file="+cfg, "--web.config.file="+webConfig, "--log.level=debug")
	addr := strings.TrimPrefix(d.url, "http://")
	base := "https://" + addr

	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	t.Cleanup(trusting.CloseIdleConnections)

	t.Run("plain HTTP is not served", func(t *testing.T) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return // refused outright: fine
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "kvload_") {
			t.Errorf("plain HTTP got %s:\n%s", resp.Status, body)
		}
	})

	t.Run("the certificate verifies against the test CA only", func(t *testing.T) {
		strict := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}}
		defer strict.CloseIdleConnections()
		_, err := strict.Get(base + "/-/healthy")
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Errorf("a client without the test CA: %v, want an unknown-authority error", err)
		}
		resp, err := trusting.Get(base + "/-/healthy")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		chains := resp.TLS.VerifiedChains
		if len(chains) == 0 || !chains[0][len(chains[0])-1].Equal(pki.ca) {
			t.Errorf("verified chains %v do not end at the test CA", chains)
		}
	})

	testutil.Eventually(t, "the replay finished", func() (bool, string) {
		code, body := authGet(t, trusting, base+"/metrics", user, password)
		return code == 200 && strings.Contains(body, `kvload_requests_total{outcome="success",target="demo",workload="w"} 4`), body
	})

	tests := []struct {
		method, path string
		user, pass   string
		wantStatus   int
		wantBody     string
	}{
		{"GET", "/metrics", "", "", 401, ""},
		{"GET", "/metrics", user, "wrong", 401, ""},
		{"GET", "/metrics", "someone", password, 401, ""},
		{"GET", "/metrics", user, password, 200, "kvload_target_info"},
		{"GET", "/", "", "", 401, ""},
		{"GET", "/", user, "wrong", 401, ""},
		{"GET", "/", user, password, 200, "<h1>kvload-exporter</h1>"},
		{"GET", "/-/healthy", "", "", 401, ""},
		{"GET", "/-/healthy", user, "wrong", 401, ""},
		{"GET", "/-/healthy", user, password, 200, "Healthy"},
		{"GET", "/-/ready", "", "", 401, ""},
		{"GET", "/-/ready", user, password, 200, "Ready"},
		{"POST", "/-/reload", "", "", 401, ""},
		{"POST", "/-/reload", user, "wrong", 401, ""},
		{"POST", "/-/reload", user, password, 200, "Reloaded"},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%s %s as %q:%q", tt.method, tt.path, tt.user, tt.pass)
		t.Run(name, func(t *testing.T) {
			code, body := authDo(t, trusting, tt.method, base+tt.path, tt.user, tt.pass)
			if code != tt.wantStatus {
				t.Errorf("status %d, want %d:\n%.300s", code, tt.wantStatus, body)
			}
			if tt.wantStatus != 200 && strings.Contains(body, "kvload") {
				t.Errorf("a refused request got content:\n%.300s", body)
			}
			if !strings.Contains(body, tt.wantBody) {
				t.Errorf("body lacks %q:\n%.300s", tt.wantBody, body)
			}
		})
	}
	if d.stop(t) != cli.ExitOK {
		t.Errorf("exit code %d", d.code)
	}
	log := d.stderr.String()
	if strings.Contains(log, password) {
		t.Errorf("the log holds the web password:\n%s", log)
	}
	// The refused plain-HTTP request and the handshake that did not verify
	// are logged by the daemon's logger, not on the standard logger.
	for _, want := range []string{"TLS is enabled", "client sent an HTTP request to an HTTPS server", "bad certificate"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
}

func authGet(t *testing.T, c *http.Client, u, user, pass string) (int, string) {
	t.Helper()
	return authDo(t, c, http.MethodGet, u, user, pass)
}

func authDo(t *testing.T, c *http.Client, method, u, user, pass string) (int, string) {
	t.Helper()
	if user == "" && pass == "" {
		return fetch(t, c, method, u, nil)
	}
	return fetch(t, c, method, u, []string{user, pass})
}

// echoCredential answers 401 with the credential the request carried, raw
// and as its Authorization header, as a careless server might.
func echoCredential(r *http.Request, _ int) (int, string) {
	auth := r.Header.Get("Authorization")
	scheme, cred, _ := strings.Cut(auth, " ")
	if scheme == "Basic" {
		b, _ := base64.StdEncoding.DecodeString(cred)
		_, cred, _ = strings.Cut(string(b), ":")
	}
	return http.StatusUnauthorized, fmt.Sprintf(`{"error":{"message":"credential %s is not valid (Authorization: %s)","type":"authentication_error"}}`, cred, auth)
}

// TestSecuritySecretsFromFiles: a bearer token (authorization.credentials_file)
// and a password (basic_auth.password_file) reach the server, which echoes
// them back in its 401 bodies, and never appear in the log at debug level,
// /metrics, the landing page, /-/reload errors or --config.check output,
// also for a dead target and for bad configurations that point at the
// secret files.
func TestSecuritySecretsFromFiles(t *testing.T) {
	t.Parallel()
	const (
		token    = "s3cr3t-fi1e-token-Qx7"
		password = "pa55-fi1e-word-Zk4"
	)
	basic := base64.StdEncoding.EncodeToString([]byte("alice:" + password))
	secrets := []string{token, password, basic}

	dir := t.TempDir()
	tokenFile, passwordFile := filepath.Join(dir, "token"), filepath.Join(dir, "password")
	daemontest.WriteFile(t, tokenFile, token+"\n")
	daemontest.WriteFile(t, passwordFile, password+"\n")
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) { f.Fail = echoCredential })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close()

	path := filepath.Join(dir, "kvload.yml")
	good := fmt.Sprintf(`targets:
  - name: bearer
    url: %[1]s
    model: m
    http_client_config:
      authorization: {credentials_file: %[3]s}
  - name: basic
    url: %[1]s
    model: m
    http_client_config:
      basic_auth: {username: alice, password_file: %[4]s}
  - name: dead
    url: %[2]s
    model: m
    http_client_config:
      authorization: {credentials_file: %[3]s}
workloads:
  - name: w
    trace: %[5]s
    targets: [bearer, basic, dead]
    block_size: 16
    loop: once
`, srv.URL, deadURL, tokenFile, passwordFile, fixture(t, "secrets.jsonl"))
	daemontest.WriteFile(t, path, good)

	// --config.check of the good file, then of each bad one below.
	var checkOutputs []string
	check := func(wantCode int) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := cli.Run(context.Background(), []string{"--config.file=" + path, "--config.check"}, &stdout, &stderr); code != wantCode {
			t.Errorf("--config.check: exit %d, want %d:\n%s%s", code, wantCode, stdout.String(), stderr.String())
		}
		checkOutputs = append(checkOutputs, stdout.String()+stderr.String())
	}
	check(cli.ExitOK)

	d := startDaemon(t, "--config.file="+path, "--log.level=debug")
	testutil.Eventually(t, "every request failed", func() (bool, string) {
		mfs := testutil.Scrape(t, d.url)
		h, _ := mfs.Value("kvload_requests_total", "outcome", "http_error")
		c, _ := mfs.Value("kvload_requests_total", "target", "dead", "outcome", "connection_error")
		return h == 8 && c == 4, fmt.Sprint(h, c)
	})
	for _, h := range []string{"Bearer " + token, "Basic " + basic} {
		if n := srv.Auth(h); n != 4 {
			t.Errorf("the server saw Authorization %q %d times, want 4: the credential files are not in use", h, n)
		}
	}

	// Mistakes that point at the secret files: their contents must not be
	// quoted in the problems.
	bad := []struct {
		name, config string
		want         string
	}{
		{"trace is the token file", strings.Replace(good, "trace: "+fixture(t, "secrets.jsonl"), "trace: "+tokenFile, 1), "invalid JSON"},
		{"CA is the password file", strings.Replace(good, "password_file: "+passwordFile+"}", "password_file: "+passwordFile+"}\n      tls_config: {ca_file: "+passwordFile+"}", 1), "unable to use specified CA cert"},
		{"key is the token file", strings.Replace(good, "credentials_file: "+tokenFile+"}", "credentials_file: "+tokenFile+"}\n      tls_config: {cert_file: "+tokenFile+", key_file: "+tokenFile+"}", 1), "targets[0].http_client_config"},
		{"two credentials", strings.Replace(good, "password_file: "+passwordFile+"}", "password_file: "+passwordFile+", password: x}", 1), "at most one of basic_auth password"},
	}
	var reloadBodies, landings []string
	for _, b := range bad {
		daemontest.WriteFile(t, path, b.config)
		check(cli.ExitBadInput)
		code, body := postReload(t, d.url)
		if code != http.StatusInternalServerError || !strings.Contains(body, b.want) {
			t.Errorf("%s: POST /-/reload: %d, want 500 with %q:\n%s", b.name, code, b.want, body)
		}
		_, landing := httpGet(t, d.url+"/")
		reloadBodies = append(reloadBodies, body)
		landings = append(landings, landing)
	}
	_, metrics := httpGet(t, d.url+"/metrics")
	if code := d.stop(t); code != cli.ExitOK {
		t.Errorf("exit code %d", code)
	}

	log := d.stderr.String()
	// The echoed credentials did reach the log's failure lines, scrubbed:
	// without that this test would prove nothing.
	if !regexp.MustCompile(`target=bearer .*last_error="HTTP 401: authentication_error: credential <secret> is not valid`).MatchString(log) {
		t.Errorf("no scrubbed failure line of target bearer in the log:\n%s", log)
	}
	for _, place := range []struct{ name, text string }{
		{"log", log},
		{"/metrics", metrics},
		{"landing page", strings.Join(landings, "\n")},
		{"reload error", strings.Join(reloadBodies, "\n")},
		{"--config.check", strings.Join(checkOutputs, "\n")},
	} {
		if strings.TrimSpace(place.text) == "" {
			t.Errorf("%s: empty", place.name)
		}
		for _, s := range secrets {
			if i := strings.Index(place.text, s); i >= 0 {
				t.Errorf("%s holds the secret %q: …%s…", place.name, s, place.text[max(0, i-100):min(len(place.text), i+len(s)+20)])
			}
		}
	}
}

// landingAllowedTags are the elements the landing page template writes;
// anything else (script, img, ...) came from data that was not escaped.
var landingAllowedTags = map[string]bool{
	"html": true, "head": true, "meta": true, "title": true, "style": true, "body": true,
	"h1": true, "h2": true, "p": true, "a": true, "table": true, "tr": true, "th": true, "td": true,
	"code": true, "span": true, "pre": true, "small": true, "tbody": true, "b": true, "br": true,
}

// checkLandingMarkup parses a landing page and reports elements the
// template does not write and event-handler attributes; it returns the
// page's text, entities decoded.
func checkLandingMarkup(t *testing.T, page string) string {
	t.Helper()
	z := html.NewTokenizer(strings.NewReader(page))
	var text strings.Builder
	for {
		switch z.Next() {
		case html.ErrorToken:
			if !errors.Is(z.Err(), io.EOF) {
				t.Fatal(z.Err())
			}
			return text.String()
		case html.TextToken:
			text.Write(z.Text())
		case html.StartTagToken, html.SelfClosingTagToken:
			tok := z.Token()
			if !landingAllowedTags[tok.Data] {
				t.Errorf("landing page has a <%s> element: %s", tok.Data, tok)
			}
			for _, a := range tok.Attr {
				if strings.HasPrefix(strings.ToLower(a.Key), "on") {
					t.Errorf("landing page has an event handler: %s", tok)
				}
			}
		}
	}
}

// TestSecurityLandingEscapes puts markup everywhere a configuration or a
// target can put text that reaches the landing page (model names, the
// configuration file's own name, reload problems quoting names) and checks
// that the page shows it as text, never as markup.
func TestSecurityLandingEscapes(t *testing.T) {
	t.Parallel()
	const (
		scriptModel = `<script>alert(1)</script>`
		attrModel   = `"><img src=x onerror=alert(2)>`
		errorBody   = `<script>alert(3)</script>`
		fileName    = `kv"><img src=x onerror=alert(4)>.yml`
		badName     = `<script>alert(5)</script>`
	)
	srv := testutil.NewFakeServer(t, func(f *testutil.FakeServer) {
		f.Fail = func(*http.Request, int) (int, string) { return http.StatusInternalServerError, errorBody }
	})
	path := filepath.Join(t.TempDir(), fileName)
	good := func() config.Config {
		return config.Config{
			Targets: []config.Target{
				{Name: "failing", URL: srv.URL, Model: scriptModel},
				{Name: "demo", Model: attrModel, Emulate: &config.Emulate{InterToken: time.Millisecond}},
			},
			Workloads: []config.Workload{daemontest.Workload("w", fixture(t, "tiny.jsonl"), "failing", "demo")},
		}
	}
	daemontest.WriteConfig(t, path, good())
	d := startDaemon(t, "--config.file="+path)
	testutil.Eventually(t, "both targets replayed", func() (bool, string) {
		mfs := testutil.Scrape(t, d.url)
		e, _ := mfs.Value("kvload_requests_total", "target", "failing", "outcome", "http_error")
		s, _ := mfs.Value("kvload_requests_total", "target", "demo", "outcome", "success")
		return e == 4 && s == 4, fmt.Sprint(e, s)
	})
	if log := d.stderr.String(); !strings.Contains(log, errorBody) {
		t.Errorf("the target's error body never reached the daemon (no failure line with %q):\n%s", errorBody, log)
	}
	_, page := httpGet(t, d.url+"/")

	// A rejected reload whose problems quote odd names back.
	bad := good()
	bad.Workloads[0].Name = badName
	bad.Workloads[0].Targets = []string{"failing", badName}
	daemontest.WriteConfig(t, path, bad)
	if code, body := postReload(t, d.url); code != http.StatusInternalServerError || !strings.Contains(body, badName) {
		t.Errorf("POST /-/reload: %d, want 500 quoting %q:\n%s", code, badName, body)
	}
	_, badPage := httpGet(t, d.url+"/")

	for _, p := range []struct {
		name, page string
		shown      []string // must be on the page as text
	}{
		{"running", page, []string{scriptModel, attrModel, fileName}},
		{"after a rejected reload", badPage, []string{scriptModel, attrModel, fileName, badName}},
	} {
		t.Run(p.name, func(t *testing.T) {
			text := checkLandingMarkup(t, p.page)
			for _, s := range p.shown {
				if !strings.Contains(text, s) {
					t.Errorf("the page does not show %q as text", s)
				}
			}
			for _, raw := range []string{scriptModel, attrModel, errorBody, fileName, badName, "<script", "<img"} {
				if strings.Contains(p.page, raw) {
					t.Errorf("the page holds %q unescaped", raw)
				}
			}
			if t.Failed() {
				t.Logf("page:\n%s", p.page)
			}
		})
	}
}

// floodRequest sends a request whose body is total bytes (declared with
// Content-Length, or chunked), writing the body while it reads the
// response. It returns the status and how many body bytes the connection
// took before the server answered: a server reading the body unbounded
// takes all of them.
func floodRequest(t *testing.T, addr, method, path string, chunked bool, total int64) (int, string, int64) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(testutil.Ceiling)) // a hang guard; the reads report its failure
	framing := fmt.Sprintf("Content-Length: %d", total)
	if chunked {
		framing = "Transfer-Encoding: chunked"
	}
	if _, err := fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s\r\n\r\n", method, path, addr, framing); err != nil {
		t.Fatal(err)
	}
	var sent int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		chunk := bytes.Repeat([]byte("a"), 256<<10)
		for sent < total {
			data := chunk[:min(int64(len(chunk)), total-sent)]
			if chunked {
				if _, err := fmt.Fprintf(conn, "%x\r\n", len(data)); err != nil {
					return
				}
			}
			n, err := conn.Write(data)
			sent += int64(n)
			if err != nil {
				return
			}
			if chunked {
				if _, err := io.WriteString(conn, "\r\n"); err != nil {
					return
				}
			}
		}
		if chunked {
			io.WriteString(conn, "0\r\n\r\n")
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: no response: %v", method, path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	conn.Close() // ends the writer if the server keeps the connection
	<-done
	return resp.StatusCode, string(body), sent
}

// socketSlack is what socket buffers hold of a body the server never read.
const socketSlack = 24 << 20

// TestSecurityBoundedBodies: what the daemon reads from clients (POST
// /-/reload, the emulated engine's API) and from targets (error bodies, SSE
// events) is bounded, and failures log a short error text.
func TestSecurityBoundedBodies(t *testing.T) {
	t.Parallel()
	const errorBodySize = 50 << 20
	var (
		mu          sync.Mutex
		maxWritten  = map[string]int{}
		handlersRun = map[string]int{}
	)
	// flood answers with head, then filler, until total bytes or the
	// client goes away, and records how far it got.
	flood := func(name string, status int, contentType, head string, filler byte, total int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			n := 0
			defer func() {
				mu.Lock()
				maxWritten[name] = max(maxWritten[name], n)
				handlersRun[name]++
				mu.Unlock()
			}()
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", contentType)
			w.WriteHeader(status)
			k, err := io.WriteString(w, head)
			n += k
			chunk := bytes.Repeat([]byte{filler}, 64<<10)
			for err == nil && n < total {
				k, err = w.Write(chunk[:min(len(chunk), total-n)])
				n += k
			}
		}
	}
	bigError := httptest.NewServer(flood("big-error", 500, "text/plain", "", 'x', errorBodySize))
	t.Cleanup(bigError.Close)
	bigEvent := httptest.NewServer(flood("big-event", 200, "text/event-stream", "data: ", 'z', 64<<20))
	t.Cleanup(bigEvent.Close)

	path := filepath.Join(t.TempDir(), "kvload.yml")
	daemontest.WriteConfig(t, path, config.Config{
		Targets: []config.Target{
			{Name: "big-error", URL: bigError.URL, Model: "m"},
			{Name: "big-event", URL: bigEvent.URL, Model: "m"},
			{Name: "demo", Emulate: &config.Emulate{InterToken: time.Millisecond, MaxBodyBytes: 1 << 20}},
		},
		Workloads: []config.Workload{daemontest.Workload("w", fixture(t, "secrets.jsonl"), "big-error", "big-event", "demo")},
	})
	d := startDaemon(t, "--config.file="+path)
	testutil.Eventually(t, "every request ended", func() (bool, string) {
		mfs := testutil.Scrape(t, d.url)
		h, _ := mfs.Value("kvload_requests_total", "target", "big-error", "outcome", "http_error")
		s, _ := mfs.Value("kvload_requests_total", "target", "big-event", "outcome", "stream_error")
		mu.Lock()
		defer mu.Unlock()
		return h == 4 && s == 4 && handlersRun["big-error"] == 4 && handlersRun["big-event"] == 4,
			fmt.Sprintf("http_error %v, stream_error %v, handlers %v", h, s, handlersRun)
	})
	mu.Lock()
	for name, limit := range map[string]int{"big-error": 64 << 10, "big-event": 16 << 20} {
		if n := maxWritten[name]; n > limit+socketSlack {
			t.Errorf("%s: the server got %d bytes out to one request: the client reads far more than %d", name, n, limit)
		}
	}
	mu.Unlock()

	addr := strings.TrimPrefix(d.url, "http://")
	m := regexp.MustCompile(`msg="emulated engine started" target=demo url=http://(127\.0\.0\.1:\d+)`).FindStringSubmatch(d.stderr.String())
	if m == nil {
		t.Fatalf("the emulated engine's address is not in the log:\n%s", d.stderr.String())
	}
	emulator := m[1]
	tests := []struct {
		name         string
		addr, path   string
		chunked      bool
		total, limit int64
		wantStatus   int
		wantBody     string
	}{
		{"reload, 256 MiB declared", addr, "/-/reload", false, 256 << 20, 0, 200, "Reloaded"},
		{"reload, 256 MiB chunked", addr, "/-/reload", true, 256 << 20, 0, 200, "Reloaded"},
		{"emulator, 64 MiB declared", emulator, "/v1/chat/completions", false, 64 << 20, 1 << 20, 413, "exceeds 1048576 bytes"},
		{"emulator, 64 MiB chunked", emulator, "/v1/completions", true, 64 << 20, 1 << 20, 413, "exceeds 1048576 bytes"},
		{"emulator, just over the limit", emulator, "/v1/completions", false, 1<<20 + 1, 1 << 20, 413, "exceeds 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, sent := floodRequest(t, tt.addr, "POST", tt.path, tt.chunked, tt.total)
			t.Logf("%d %q after %d of %d body bytes", code, strings.TrimSpace(body), sent, tt.total)
			if code != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Errorf("status %d %q, want %d with %q", code, body, tt.wantStatus, tt.wantBody)
			}
			if tt.total > tt.limit+socketSlack && sent >= tt.total {
				t.Errorf("the whole %d-byte body was taken: it is read unbounded", tt.total)
			}
		})
	}

	if d.stop(t) != cli.ExitOK {
		t.Errorf("exit code %d", d.code)
	}
	failures := 0
	for _, line := range strings.Split(d.stderr.String(), "\n") {
		if strings.Contains(line, "requests fail") {
			failures++
			if len(line) > 1024 {
				t.Errorf("a %d-byte log line: %.400s…", len(line), line)
			}
		}
	}
	if failures < 2 {
		t.Errorf("%d failure lines in the log, want one per failing target at least:\n%s", failures, d.stderr.String())
	}
}
