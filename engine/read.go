package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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

// ReadAnswer sends req with c (a NoRedirects client) and returns the body
// of its 200 answer, at most maxBody bytes: the exporter's reads of a
// target beside the replay (cache size, tokenize check). A redirect or
// any other status is an error naming the method and URL, with the start
// of the body.
func ReadAnswer(c *http.Client, req *http.Request, maxBody int64) ([]byte, error) {
	where := req.Method + " " + req.URL.Redacted()
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if err := RedirectError(resp); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d: %.200s", where, resp.StatusCode, bytes.TrimSpace(b))
	}
	return b, nil
}
