package dashtest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An alert tape is one alert scenario's recording: every scrape of the
// exporter's kvload_ samples, in order, with the scenario's name, its
// compression and the rule time of its change. Evaluating the rule files
// over a tape gives the same alert states as the live run did, on any
// machine and under any load: the rules are judged in rule time, on what
// the exporter really said. KVLOAD_ALERT_TAPES=dir makes the live
// scenarios write their tapes there; TestAlertTapes judges the tapes kept
// in testdata/alerts.
//
// The format is plain text, gzipped:
//
//	# kvload-alert-tape 1
//	# scenario <name>
//	# compression <rule seconds per scrape>
//	# scrape
//	<kvload_ lines of scrape 0>
//	# scrape
//	...
//	# change_at <Go duration, or -1ns without a change>
const tapeMagic = "# kvload-alert-tape 1"

// tapeWriter writes one tape.
type tapeWriter struct {
	f  *os.File
	gz *gzip.Writer
	w  *bufio.Writer
}

// newTapeWriter starts a new tape of scenario in dir, under a name of its
// own (tapeSlug, then a unique part).
func newTapeWriter(dir, scenario string, compression float64) (*tapeWriter, error) {
	f, err := os.CreateTemp(dir, tapeSlug(scenario)+".*.tape.gz")
	if err != nil {
		return nil, fmt.Errorf("alert tape: %w", err)
	}
	gz := gzip.NewWriter(f)
	w := bufio.NewWriter(gz)
	fmt.Fprintf(w, "%s\n# scenario %s\n# compression %g\n", tapeMagic, scenario, compression)
	return &tapeWriter{f: f, gz: gz, w: w}, nil
}

// scrape writes one scrape's kvload_ sample lines.
func (t *tapeWriter) scrape(body []byte) error {
	if _, err := t.w.WriteString("# scrape\n"); err != nil {
		return fmt.Errorf("alert tape: %w", err)
	}
	for line := range bytes.Lines(body) {
		if !bytes.HasPrefix(line, []byte("kvload_")) {
			continue
		}
		if _, err := t.w.Write(line); err != nil {
			return fmt.Errorf("alert tape: %w", err)
		}
	}
	return nil
}

// finish writes the change's rule time and closes the tape.
func (t *tapeWriter) finish(changeAt time.Duration) error {
	fmt.Fprintf(t.w, "# change_at %v\n", changeAt)
	err := t.w.Flush()
	if e := t.gz.Close(); err == nil {
		err = e
	}
	if e := t.f.Close(); err == nil {
		err = e
	}
	if err != nil {
		return fmt.Errorf("alert tape %s: %w", t.f.Name(), err)
	}
	return nil
}

// tape is a tape read back into a recorder's storage.
type tape struct {
	scenario string
	changeAt time.Duration
	rec      *recorder
}

// loadTape reads a tape into a fresh in-memory TSDB, each scrape at its
// rule time, as the live recorder stored it.
func loadTape(t *testing.T, path string) *tape {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	sc := bufio.NewScanner(gz)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var (
		tp    = &tape{changeAt: -2}
		body  []byte
		inSc  bool
		line  int
		ctx   = context.Background()
		flush = func() {
			if inSc {
				if err := tp.rec.store(ctx, body); err != nil {
					t.Fatalf("%s:%d: %v", path, line, err)
				}
			}
			body = body[:0]
		}
	)
	for sc.Scan() {
		line++
		s := sc.Text()
		switch {
		case line == 1:
			if s != tapeMagic {
				t.Fatalf("%s:1: not an alert tape (%q)", path, s)
			}
		case strings.HasPrefix(s, "# scenario "):
			tp.scenario = strings.TrimPrefix(s, "# scenario ")
		case strings.HasPrefix(s, "# compression "):
			c, err := strconv.ParseFloat(strings.TrimPrefix(s, "# compression "), 64)
			if err != nil || c <= 0 {
				t.Fatalf("%s:%d: bad compression %q", path, line, s)
			}
			tp.rec = tapeRecorder(t, c)
		case s == "# scrape":
			if tp.rec == nil {
				t.Fatalf("%s:%d: scrape before the compression line", path, line)
			}
			flush()
			inSc = true
		case strings.HasPrefix(s, "# change_at "):
			flush()
			inSc = false
			d, err := time.ParseDuration(strings.TrimPrefix(s, "# change_at "))
			if err != nil {
				t.Fatalf("%s:%d: bad change time %q: %v", path, line, s, err)
			}
			tp.changeAt = d
		default:
			body = append(body, s...)
			body = append(body, '\n')
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if tp.scenario == "" || tp.rec == nil || tp.changeAt == -2 || tp.rec.scrapes < 2 {
		t.Fatalf("%s: incomplete tape (scenario %q, %d scrapes, change %v)", path, tp.scenario, scrapesOf(tp.rec), tp.changeAt)
	}
	if tp.changeAt < 0 {
		tp.changeAt = -1
	}
	return tp
}

func scrapesOf(r *recorder) int {
	if r == nil {
		return 0
	}
	return r.scrapes
}

// tapeRecorder is a recorder with nothing to scrape: a tape fills it.
func tapeRecorder(t *testing.T, compression float64) *recorder {
	t.Helper()
	rec := newRecorder(t, "tape", compression)
	rec.url = ""
	return rec
}

// tapeSlug is a scenario's name with every run of other characters than
// letters and digits made one dash.
func tapeSlug(scenario string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(scenario) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
