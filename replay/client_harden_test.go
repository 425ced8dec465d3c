package replay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/common/config"
)

// TestClientDoesNotFollowRedirects: a 3xx ends the request as an
// http_error with its status, and the server it points to (another port,
// which net/http would send the credentials to) receives nothing. The
// target uses the config's default HTTP client settings, where
// follow_redirects is true.
func TestClientDoesNotFollowRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	other := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		t.Errorf("the redirect was followed: %s %s with Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
	}))
	for _, status := range []int{301, 302, 303, 307, 308} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				http.Redirect(w, r, other.URL+r.URL.Path, status)
			}))
			hc := config.DefaultHTTPClientConfig
			hc.Authorization = &config.Authorization{Type: "Bearer", Credentials: "tok-r3d1rect"}
			u := strings.Replace(srv.URL, "http://", "http://alice:pa55@", 1)
			c := mustClient(t, TargetConfig{URL: u, Dialect: DialectVLLM, HTTPClientConfig: hc})
			var res Result
			c.Do(context.Background(), Request{Prompt: "x"}, &res)
			checkResult(t, &res, want{outcome: OutcomeHTTPError, status: status, errSub: fmt.Sprintf("HTTP %d: ", status)})
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the other server received %d requests", n)
	}
}
