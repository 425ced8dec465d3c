package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Bounds of one read of a target's /metrics. A page longer than
// maxMetricsBytes is refused, not cut: a cut page could lack a series and
// read as a reset. The page is streamed and only the lines of the families
// asked for reach the parser, so what a read holds at once is
// maxFamilyBytes of those lines, not the page. maxFamilyBytes is far above
// what an engine's counters take (a few series each), and keeps a flood of
// series of a family read from costing more than a few MiB per target.
const (
	maxMetricsBytes = 32 << 20
	maxFamilyBytes  = 256 << 10
	// filterBufferBytes is the filter's line buffer: a line's family is
	// told from its first filterBufferBytes bytes.
	filterBufferBytes = 64 << 10
)

// ErrDuplicateSeries is wrapped by a read of a page that holds one series
// (a name and a label set) twice: summing both would count it twice, and
// taking either is a guess.
var ErrDuplicateSeries = errors.New("duplicated series")

// errPageTooLarge is wrapped by a read of a page over maxMetricsBytes.
var errPageTooLarge = fmt.Errorf("page larger than %d MiB: refused", maxMetricsBytes>>20)

// errFamiliesTooLarge is wrapped by a read whose families asked for take
// more than maxFamilyBytes of the page.
var errFamiliesTooLarge = fmt.Errorf("the series read take more than %d KiB of the page: refused", maxFamilyBytes>>10)

// metricsRead is one read of the families named of the page at url.
type metricsRead struct {
	client   *http.Client
	url      string
	families []string
	// headerTimeout, when set, bounds the wait for the answer's head
	// apart from ctx, which bounds the whole read.
	headerTimeout time.Duration
}

// read GETs the page and parses the families asked for as it arrives,
// within ctx. Its errors name the URL; one that ran out of time wraps
// context.DeadlineExceeded.
func (m metricsRead) read(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url, nil)
	if err != nil {
		return nil, err
	}
	where := "GET " + req.URL.Redacted()
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	stop := func() bool { return true }
	if m.headerTimeout > 0 {
		// The cause wraps context.DeadlineExceeded: a timeout, as the
		// whole read's deadline is.
		late := fmt.Errorf("no answer head within %v: %w", m.headerTimeout, context.DeadlineExceeded)
		stop = time.AfterFunc(m.headerTimeout, func() { cancel(late) }).Stop
	}
	resp, err := m.client.Do(req)
	stop()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, causeOf(ctx, err))
	}
	defer resp.Body.Close()
	if err := RedirectError(resp); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: HTTP %d: %.200s", where, resp.StatusCode, bytes.TrimSpace(b))
	}
	mfs, err := parseFamilies(resp.Body, m.families)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, causeOf(ctx, err))
	}
	return mfs, nil
}

// causeOf is err, or why ctx ended when it did: the error a cancelled
// read returns does not always say (a body read cut by a deadline, a
// header timeout).
func causeOf(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

// parseFamilies parses the families named from a page in the Prometheus
// text format, read as a stream: only their lines reach the parser. A page
// over maxMetricsBytes, families over maxFamilyBytes, and a series that
// appears twice are errors.
func parseFamilies(page io.Reader, families []string) (map[string]*dto.MetricFamily, error) {
	f := newFamilyFilter(http.MaxBytesReader(nil, io.NopCloser(page), maxMetricsBytes), families)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(f)
	switch {
	case f.err != nil:
		// What cut the stream says more than the parse error it caused.
		return nil, f.err
	case err != nil:
		return nil, err
	}
	for _, name := range families {
		if err := noDuplicates(mfs[name]); err != nil {
			return nil, err
		}
	}
	return mfs, nil
}

// noDuplicates fails when mf holds one label set twice. A histogram's or
// summary's lines are merged by label set as they are parsed, so only the
// other types can show a duplicate.
func noDuplicates(mf *dto.MetricFamily) error {
	if mf == nil || len(mf.GetMetric()) < 2 {
		return nil
	}
	seen := make(map[string]bool, len(mf.GetMetric()))
	for _, m := range mf.GetMetric() {
		k := seriesKey(m)
		if seen[k] {
			return fmt.Errorf("%w: %s%s appears more than once", ErrDuplicateSeries, mf.GetName(), labelsText(m))
		}
		seen[k] = true
	}
	return nil
}

// seriesKey tells a series of a family from the others: its labels,
// sorted by name.
func seriesKey(m *dto.Metric) string {
	labels := m.GetLabel()
	if len(labels) == 0 {
		return ""
	}
	pairs := make([]string, len(labels))
	for i, l := range labels {
		pairs[i] = l.GetName() + "\xff" + l.GetValue()
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "\xfe")
}

// labelsText is m's label set as the text format writes it, cut to 200
// bytes, for messages.
func labelsText(m *dto.Metric) string {
	if len(m.GetLabel()) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, l := range m.GetLabel() {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", l.GetName(), l.GetValue())
	}
	b.WriteByte('}')
	s := b.String()
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// familyFilter passes on the lines of a text-format page that may belong
// to the families named, and drops every other line unread by the parser.
// A line of a family holds the family's name (a histogram's or summary's
// sample lines extend it, a quoted name is the same bytes in quotes), so
// keeping each line whose first filterBufferBytes bytes contain a name is
// a superset of those lines, and the parse of those families is what the
// whole page's would be. Lines are never held whole: a long line passes or
// is dropped in pieces.
type familyFilter struct {
	in    *bufio.Reader
	names [][]byte
	// pending is the rest of a kept piece not yet handed out; it points
	// into in's buffer, valid until the next read from in.
	pending []byte
	midLine bool // the last piece read did not end its line
	keeping bool // the line being read is kept
	kept    int  // bytes kept
	// err is what ended the stream early: a read error or a bound; nil
	// at the page's end.
	err error
	eof bool
}

func newFamilyFilter(page io.Reader, families []string) *familyFilter {
	f := &familyFilter{in: bufio.NewReaderSize(page, filterBufferBytes)}
	for _, name := range families {
		f.names = append(f.names, []byte(name))
	}
	return f
}

// Read implements io.Reader for the parser.
func (f *familyFilter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if f.eof {
			return 0, io.EOF
		}
		if f.err != nil {
			return 0, f.err
		}
		piece, err := f.in.ReadSlice('\n')
		if !f.midLine {
			f.keeping = f.wanted(piece)
		}
		f.midLine = errors.Is(err, bufio.ErrBufferFull)
		if f.keeping {
			f.kept += len(piece)
			f.pending = piece
		}
		switch {
		case f.kept > maxFamilyBytes:
			f.err, f.pending = errFamiliesTooLarge, nil
		case err == nil, f.midLine:
		case errors.Is(err, io.EOF):
			f.eof = true
		default:
			f.err = pageError(err)
		}
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// wanted tells whether a line that starts with piece may belong to one of
// the families.
func (f *familyFilter) wanted(piece []byte) bool {
	for _, name := range f.names {
		if bytes.Contains(piece, name) {
			return true
		}
	}
	return false
}

// pageError is a read error of the page, the size bound's said plainly.
func pageError(err error) error {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return errPageTooLarge
	}
	return err
}
