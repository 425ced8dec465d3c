package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	promconfig "github.com/prometheus/common/config"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
)

// TestTargetReadsDoNotFollowRedirects: the server-metrics scrape and the
// cache discovery send the target's credentials; a redirect to the same host
// on another port must not take them there. Each read fails with an error
// naming the target and the redirect, and the other server sees nothing.
func TestTargetReadsDoNotFollowRedirects(t *testing.T) {
	t.Parallel()
	const token = "tok-r3d1rect"
	reads := []struct {
		name string
		read func(ctx context.Context, tg *config.Target, url string) error
	}{
		{"server metrics", func(ctx context.Context, tg *config.Target, url string) error {
			sc, err := newServerScraper(tg, url+"/metrics")
			if err != nil {
				return err
			}
			defer sc.Client.CloseIdleConnections()
			return sc.Prime(ctx)
		}},
		{"cache discovery", func(ctx context.Context, tg *config.Target, url string) error {
			_, err := discoverLayout(ctx, tg, url)
			return err
		}},
	}
	for _, rd := range reads {
		for _, status := range []int{301, 302, 303, 307, 308} {
			t.Run(fmt.Sprintf("%s %d", rd.name, status), func(t *testing.T) {
				t.Parallel()
				var mu sync.Mutex
				var elsewhere []string // what reached the other server
				var auth []string      // the Authorization the target got
				other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					elsewhere = append(elsewhere, fmt.Sprintf("%s %s Authorization=%q", r.Method, r.URL, r.Header.Get("Authorization")))
					mu.Unlock()
				}))
				t.Cleanup(other.Close)
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					auth = append(auth, r.Header.Get("Authorization"))
					mu.Unlock()
					http.Redirect(w, r, other.URL+r.URL.Path, status)
				}))
				t.Cleanup(srv.Close)
				// The defaults, where follow_redirects is true.
				hc := promconfig.DefaultHTTPClientConfig
				hc.Authorization = &promconfig.Authorization{Type: "Bearer", Credentials: token}
				tg := &config.Target{Name: "t-redirecting", Dialect: "vllm", HTTPClientConfig: &hc}

				err := rd.read(t.Context(), tg, srv.URL)
				if !errors.Is(err, engine.ErrRedirect) {
					t.Fatalf("error %v, want one wrapping engine.ErrRedirect", err)
				}
				for _, want := range []string{"t-redirecting", fmt.Sprintf("HTTP %d to %s/", status, other.URL)} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if len(elsewhere) > 0 {
					t.Errorf("the redirect was followed: %q", elsewhere)
				}
				// The credentials were sent, to the target only: the check
				// above would pass vacuously without them.
				if len(auth) != 1 || auth[0] != "Bearer "+token {
					t.Errorf("the target received Authorization %q, want one %q", auth, "Bearer "+token)
				}
			})
		}
	}
}
