package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrTooFewHashIDs matches the error of a row whose hash_ids cannot hold its
// input_length at the block size it is read with: most often a trace made
// with another block size than the reader was told.
var ErrTooFewHashIDs = errors.New("hash_ids too few for input_length")

// blocksError is a row's input_length that its hash_ids do not cover.
type blocksError struct {
	isl, ids, blockSize, need int
}

func (e *blocksError) Error() string {
	if e.isl < 1 {
		return fmt.Sprintf("input_length %d does not fit %d hash_ids of %d-token blocks: it needs at least 1 token",
			e.isl, e.ids, e.blockSize)
	}
	return fmt.Sprintf("input_length %d does not fit %d hash_ids of %d-token blocks: it needs %d",
		e.isl, e.ids, e.blockSize, e.need)
}

func (e *blocksError) Is(target error) bool { return target == ErrTooFewHashIDs }

// FittingIDs is how many blockSize-token blocks input_length tokens fill:
// ⌈isl/blockSize⌉, computed without overflow for a huge block size.
func FittingIDs(isl, blockSize int) int {
	if isl < 1 {
		return 0
	}
	return (isl-1)/blockSize + 1
}

// Surplus counts the rows of a trace whose hash_ids run past their
// input_length: AIPerf's analyze-trace takes such rows as they are, and a
// prompt is built from the ids that fit, so the others name blocks that
// are never sent. Many such rows usually mean that the trace was made with
// smaller blocks than it is read with.
type Surplus struct {
	Rows      int   // rows with more hash_ids than they need
	IDs       int64 // ids beyond those needed, over all rows
	Most      int   // the most beyond need in one row
	FirstLine int   // the line of the first such row
	BlockSize int   // the block size the rows were measured with
}

func (s *Surplus) add(extra, line int) {
	if extra <= 0 {
		return
	}
	if s.Rows == 0 {
		s.FirstLine = line
	}
	s.Rows++
	s.IDs += int64(extra)
	s.Most = max(s.Most, extra)
}

// String says what was found, in one line; "" for none.
func (s Surplus) String() string {
	ids := func(n int64) string {
		if n == 1 {
			return "1 id"
		}
		return fmt.Sprintf("%d ids", n)
	}
	switch s.Rows {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("1 row has more hash_ids than its input_length fills in %d-token blocks (line %d): %s to spare",
			s.BlockSize, s.FirstLine, ids(s.IDs))
	}
	return fmt.Sprintf("%d rows have more hash_ids than their input_length fills in %d-token blocks (the first at line %d): %s to spare in all, at most %d in one row",
		s.Rows, s.BlockSize, s.FirstLine, ids(s.IDs), s.Most)
}

// Count counts r if it has hash_ids to spare at s.BlockSize, leaving it as
// it is.
func (s *Surplus) Count(r *Record) {
	if r.InputLength != nil && len(r.HashIDs) > 0 {
		s.add(len(r.HashIDs)-FittingIDs(*r.InputLength, s.BlockSize), r.Line)
	}
}

// FitRecords keeps in each row only the hash_ids that its input_length
// fills at blockSize, and counts what it cut.
func FitRecords(rows []Record, blockSize int) Surplus {
	s := Surplus{BlockSize: blockSize}
	for i := range rows {
		r := &rows[i]
		s.Count(r)
		if r.InputLength != nil {
			if need := FittingIDs(*r.InputLength, blockSize); len(r.HashIDs) > need {
				r.HashIDs = r.HashIDs[:need:need]
			}
		}
	}
	return s
}

// FitTable is FitRecords on a table: t itself when no row has ids to spare
// (the common case costs one pass over the id counts), else a new table.
func FitTable(t *Table, blockSize int) (*Table, Surplus, error) {
	s := Surplus{BlockSize: blockSize}
	for i := range t.Len() {
		if n := t.hashIDCount(i); n > 0 {
			s.add(n-FittingIDs(t.ISL(i), blockSize), t.Line(i))
		}
	}
	if s.Rows == 0 {
		return t, s, nil
	}
	b := NewTableBuilder(t.Len())
	for i := range t.Len() {
		r := t.Record(i)
		if len(r.HashIDs) > 0 {
			r.HashIDs = r.HashIDs[:min(len(r.HashIDs), FittingIDs(r.ISL(), blockSize))]
		}
		if err := b.Append(&r); err != nil {
			return nil, s, fmt.Errorf("line %d: %w", r.Line, err)
		}
	}
	return b.Table(), s, nil
}

// hashIDCount is the number of row i's hash_ids, read from the count that
// leads its ids without decoding them.
func (t *Table) hashIDCount(i int) int {
	n, _ := binary.Uvarint(t.ids[t.idOff[i]:t.idOff[i+1]])
	return max(int(n)-1, 0)
}
