package engine

import (
	"errors"
	"fmt"
	"net/http"
)

// NoRedirects makes c hand back a redirect as its response instead of
// following it, whatever follow_redirects says: net/http would resend the
// request and, to the same host on another port, its credentials. Every
// client the exporter sends to a target with is made so (requests,
// server-metrics scrapes, cache discovery).
func NoRedirects(c *http.Client) { c.CheckRedirect = keepRedirect }

func keepRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// ErrRedirect is wrapped by RedirectError.
var ErrRedirect = errors.New("redirect not followed")

// RedirectError says where a redirect that a NoRedirects client handed
// back pointed, wrapping ErrRedirect; it is nil when resp is no redirect.
func RedirectError(resp *http.Response) error {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return nil
	}
	to := "no Location"
	if loc, err := resp.Location(); err == nil {
		to = loc.Redacted()
	}
	return fmt.Errorf("HTTP %d to %s: %w (credentials go only to the configured URL)", resp.StatusCode, to, ErrRedirect)
}
