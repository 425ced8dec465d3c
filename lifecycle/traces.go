package lifecycle

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"sync/atomic"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// traceCache keeps the traces of the running configuration between
// reloads. A trace of millions of rows takes seconds to parse and hundreds
// of megabytes to hold: a reload must not read a file that has not changed,
// and workloads and targets that use the same file share one copy.
//
// A file is known by its path and the block size its rows are checked
// against; it is read again only when the file itself, its size or its
// modification time changed, and if its bytes turn out the same, what was
// built from it is kept. A plan (the rows after synthesis, and their
// schedule) is known by its file and the synthesis knobs.
//
// Synthesis makes rows of its own: once every plan of a file has them, the
// file's own rows are let go (a trace of millions of rows is a hundred
// megabytes), and read again only if a later load needs them for a plan
// it does not already have.
//
// Only the daemon's owner goroutine uses a cache; each (re)load fills a new
// one from the last, which replaces it once the configuration is applied,
// so that traces no longer used are let go.
type traceCache struct {
	files map[fileKey]*parsedFile
	plans map[planKey]*tracePlan
	stats *traceStats // shared by a cache and the ones made from it
}

type fileKey struct {
	path      string
	blockSize int
}

type planKey struct {
	file  fileKey
	knobs synth.Knobs
	sched replay.Schedule
}

// parsedFile is a trace file as read.
type parsedFile struct {
	info os.FileInfo  // the file when it was read: its identity, size and mtime
	hash string       // of its bytes, to tell a touched file from a changed one
	rows *trace.Table // nil once let go (see letGoOfUnusedRows)
	// surplus counts the rows whose hash_ids run past their input_length,
	// cut to the ids that fit in rows; noted once the daemon logged it.
	surplus trace.Surplus
	noted   bool
}

// tracePlan is a workload's trace ready to replay.
type tracePlan struct {
	file *parsedFile
	plan *replay.Plan
	// reuse is what the rows replayed reuse of their ids after another
	// chain of blocks (synth.ChainReuseOf), for the workload's note.
	reuse chainReuse
}

// chainReuse counts a trace's rows that reuse a hash id after another chain.
type chainReuse struct{ rows, reusing, firstLine int }

// traceStats counts the work a cache did, for tests.
type traceStats struct {
	parses atomic.Int64 // files read and parsed
}

func newTraceCache() *traceCache {
	return &traceCache{files: map[fileKey]*parsedFile{}, plans: map[planKey]*tracePlan{}, stats: &traceStats{}}
}

// next returns an empty cache that reuses what c holds.
func (c *traceCache) next() *traceCache {
	return &traceCache{files: map[fileKey]*parsedFile{}, plans: map[planKey]*tracePlan{}, stats: c.stats}
}

// hashSeed keys the content hash: it is compared only within this process.
var hashSeed = maphash.MakeSeed()

// plan returns the trace of w ready to replay, from prev when its file has
// not changed, and records it in c. Errors name the workload and the file.
func (c *traceCache) plan(ctx context.Context, prev *traceCache, path string, w *config.Workload, k synth.Knobs) (*tracePlan, error) {
	fk := fileKey{path: path, blockSize: w.BlockSize}
	pf := c.files[fk] // already read for another workload of this load
	if pf == nil {
		var err error
		if pf, err = c.fileOf(ctx, prev.files[fk], fk, w); err != nil {
			if access := (*traceAccessError)(nil); errors.As(err, &access) {
				return nil, err // named by the caller, with its YAML key
			}
			return nil, fmt.Errorf("workload %s: %w", w.Name, err)
		}
		c.files[fk] = pf
	}
	pk := planKey{file: fk, knobs: k, sched: w.Schedule.Replay(w.Seed)}
	if !k.Rewrites() {
		pk.knobs.Seed = 0 // no random stream is drawn: workloads of other seeds share the plan
	}
	if tp := c.plans[pk]; tp != nil {
		return tp, nil
	}
	if tp := prev.plans[pk]; tp != nil && tp.file == pf {
		c.plans[pk] = tp
		return tp, nil
	}
	if pf.rows == nil {
		var err error
		if pf, err = c.readAgain(ctx, pf, fk, w); err != nil {
			return nil, fmt.Errorf("workload %s: %w", w.Name, err)
		}
	}
	rows, _, err := synth.TransformTable(pf.rows, k)
	if err != nil {
		return nil, fmt.Errorf("workload %s: synthesis of %s: %w", w.Name, path, err)
	}
	if rows.Len() == 0 {
		return nil, fmt.Errorf("workload %s: %s: no row is left after synthesis (max_isl?)", w.Name, path)
	}
	for i := range rows.Len() {
		if err := checkSendable(rows, i); err != nil {
			return nil, fmt.Errorf("workload %s: %w", w.Name, &trace.LineError{File: path, Line: rows.Line(i), Err: err})
		}
	}
	// Schedule problems (a row without a timestamp, one out of range) are
	// found here, before a reload stops anything, rather than when a unit
	// starts and the old one is already gone. Synthesis has already
	// rescaled the timestamps: the plan's speedup is 1. A schedule of the
	// workload's own replaces them.
	plan, err := replay.NewScheduledPlan(rows, 1, path, pk.sched)
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", w.Name, err)
	}
	cr := synth.ChainReuseOf(rows)
	tp := &tracePlan{file: pf, plan: plan, reuse: chainReuse{rows: rows.Len(), reusing: cr.Reusing, firstLine: cr.FirstLine}}
	c.plans[pk] = tp
	return tp, nil
}

// readAgain returns pf with its rows, which were let go, read again from
// its file (or generated again, for w's generator). A file whose bytes
// changed without its size or modification time showing it is a new file.
func (c *traceCache) readAgain(ctx context.Context, pf *parsedFile, fk fileKey, w *config.Workload) (*parsedFile, error) {
	fresh, err := c.fileOf(ctx, nil, fk, w)
	if err != nil {
		return nil, err
	}
	if fresh.hash != pf.hash {
		c.files[fk] = fresh
		return fresh, nil
	}
	pf.rows = fresh.rows
	return pf, nil
}

// letGoOfUnusedRows drops the rows of every file of c that no plan of c
// replays as they are: synthesis gave each of its plans rows of their own.
// Call it once c holds every plan of a load.
func (c *traceCache) letGoOfUnusedRows() {
	used := map[*trace.Table]bool{}
	for _, tp := range c.plans {
		used[tp.plan.Rows()] = true
	}
	for _, pf := range c.files {
		if !used[pf.rows] {
			pf.rows = nil
		}
	}
}

// readFile returns the parsed file, old itself when the file has not
// changed since old was read (it is then not read at all) or when its
// bytes are the same.
func (c *traceCache) readFile(ctx context.Context, old *parsedFile, fk fileKey) (*parsedFile, error) {
	// Only a regular file: opening a named pipe blocks (and with it every
	// later reload).
	fi, err := os.Stat(fk.path)
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s, not a regular file", fileKind(fi.Mode()))
	}
	if err != nil {
		return nil, &traceAccessError{err}
	}
	if old != nil && sameFile(old.info, fi) {
		return old, nil
	}
	f, err := os.Open(fk.path)
	if err != nil {
		return nil, &traceAccessError{err}
	}
	defer f.Close()
	// The identity of the file actually read, not of the name's earlier target.
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	c.stats.parses.Add(1)
	var h maphash.Hash
	h.SetSeed(hashSeed)
	// Parsing a big trace takes seconds: the reader lets a shutdown cut it.
	rows, err := trace.ReadTable(ctxReader{ctx, io.TeeReader(f, &h)}, fk.path, trace.ReadOptions{BlockSize: fk.blockSize}, fi.Size())
	if err != nil {
		return nil, err
	}
	rows, surplus, err := trace.FitTable(rows, fk.blockSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fk.path, err)
	}
	sum := h.Sum(nil)
	pf := &parsedFile{info: fi, hash: hex.EncodeToString(sum), rows: rows, surplus: surplus}
	if old != nil && old.hash == pf.hash {
		old.info = fi // touched, not changed: keep what was built from it
		if old.rows == nil {
			old.rows = pf.rows
		}
		return old, nil
	}
	return pf, nil
}

// traceAccessError: a trace file that could not be opened at all (missing,
// unreadable, not a regular file), as opposed to one with a bad line.
type traceAccessError struct{ err error }

func (e *traceAccessError) Error() string { return e.err.Error() }
func (e *traceAccessError) Unwrap() error { return e.err }

// sameFile tells whether b is the file a was, unchanged as far as its size
// and modification time tell.
func sameFile(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
