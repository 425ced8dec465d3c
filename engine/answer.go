package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// ErrAnswerTooLarge is wrapped by the read error of an answer that
// OpenAnswer's bound cut.
var ErrAnswerTooLarge = errors.New("answer larger than the exporter reads")

// maxErrorBody bounds what is read of an answer that is not a 200, for
// its error message.
const maxErrorBody = 4 << 10

// OpenAnswer sends req with c (a NoRedirects client) and hands back the
// body of its 200 answer to be read as a stream, closed by the caller. A
// read past maxBody bytes fails with ErrAnswerTooLarge: a parser sees an
// error, never a truncated answer it could take for a whole one. A
// redirect or any other status is an error naming the method and URL,
// with the start of the body. The request's context bounds the reads too.
func OpenAnswer(c *http.Client, req *http.Request, maxBody int64) (io.ReadCloser, error) {
	where := req.Method + " " + req.URL.Redacted()
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if err := RedirectError(resp); err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: HTTP %d: %.200s", where, resp.StatusCode, bytes.TrimSpace(b))
	}
	return boundedBody{http.MaxBytesReader(nil, resp.Body, maxBody)}, nil
}

// boundedBody names a read past the bound ErrAnswerTooLarge.
type boundedBody struct{ io.ReadCloser }

func (b boundedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		err = fmt.Errorf("%w (%d bytes)", ErrAnswerTooLarge, tooLarge.Limit)
	}
	return n, err
}

// ReadAnswer is OpenAnswer's answer read whole: for small answers (a
// cache layout).
func ReadAnswer(c *http.Client, req *http.Request, maxBody int64) ([]byte, error) {
	rc, err := OpenAnswer(c, req, maxBody)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Redacted(), err)
	}
	return b, nil
}
