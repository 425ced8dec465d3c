package openai

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// headersOwned are the request headers the client or HTTP itself sets: a
// session header must not be one of them.
var headersOwned = []string{
	"Accept", "Authorization", "Connection", "Content-Length", "Content-Type", "Host",
	"Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// CheckSessionHeader reports a name that cannot carry a request's session:
// one that is not an HTTP field name (RFC 9110's token) or one that the
// client or HTTP sets itself.
func CheckSessionHeader(name string) error {
	if name == "" {
		return fmt.Errorf("%q is not a header name", name)
	}
	for i := range len(name) {
		if !isTokenChar(name[i]) {
			return fmt.Errorf("%q is not a header name: it holds %q", name, name[i])
		}
	}
	if slices.Contains(headersOwned, http.CanonicalHeaderKey(name)) {
		return fmt.Errorf("%q is a header the client sets itself", name)
	}
	return nil
}

// isTokenChar tells whether c may appear in an HTTP field name.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// sessionValue is session as a header value: as it is when every byte is
// visible ASCII, percent-encoded otherwise, so that a trace's session id
// with spaces, control characters or non-ASCII text can neither break
// the header nor be trimmed by a server.
func sessionValue(session string) string {
	for i := range len(session) {
		if c := session[i]; c <= ' ' || c >= 0x7f {
			return url.PathEscape(session)
		}
	}
	return session
}
