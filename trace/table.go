package trace

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"unsafe"
)

// Table is a trace held in columns, for replaying big traces: a []Record
// costs some 500 bytes a row in pointers, slice headers and small
// allocations, most of which a Mooncake row never uses. A Table keeps the
// fields every row has in flat arrays and hash ids as varint deltas (ids
// mostly count up by one, so most take a byte), and keeps the rare fields
// (text_input, messages, payload, ...) apart, for the rows that have them.
// A Table is immutable once built and safe for concurrent readers.
type Table struct {
	ts       []float64 // ms; NaN when absent
	isl, osl []int32   // -1 when absent, bigCount when in rare
	line     []int32
	idOff    []uint32 // row i's ids are ids[idOff[i]:idOff[i+1]]
	ids      []byte   // per row: uvarint count+1 (0: no hash_ids), then zigzag varint deltas
	loID     int64    // the smallest and largest hash id; loID > hiID when there is none
	hiID     int64

	// Allocated at the first row that needs them.
	session  []int32 // index into sessions; -1 when absent
	sessions []string
	delay    []float64 // NaN when absent
	rare     map[int32]*rareFields
}

// rareFields are the fields of a row that only some traces use.
type rareFields struct {
	TextInput *string
	Messages  []json.RawMessage
	Tools     []json.RawMessage
	Payload   json.RawMessage
	Extra     json.RawMessage
	Type      *string
	Unknown   []Field
	// Counts above what an int32 holds, which the reader accepts (up to
	// 2⁴⁰) for the daemon to reject with its own message.
	BigISL, BigOSL int
}

// onlyCounts tells whether x holds nothing but big counts.
func (x *rareFields) onlyCounts() bool {
	return x.TextInput == nil && x.Messages == nil && x.Tools == nil && x.Payload == nil &&
		x.Extra == nil && x.Type == nil && x.Unknown == nil
}

// bigCount marks a count kept in rareFields.
const bigCount = -2

// Len is the number of rows.
func (t *Table) Len() int { return len(t.ts) }

// Timestamp is row i's timestamp in ms; ok is false when it has none.
func (t *Table) Timestamp(i int) (ms float64, ok bool) {
	v := t.ts[i]
	return v, !math.IsNaN(v)
}

// Delay is row i's delay in ms; ok is false when it has none.
func (t *Table) Delay(i int) (ms float64, ok bool) {
	if t.delay == nil {
		return 0, false
	}
	v := t.delay[i]
	return v, !math.IsNaN(v)
}

// SessionID is row i's session_id; ok is false when it has none.
func (t *Table) SessionID(i int) (string, bool) {
	if t.session == nil || t.session[i] < 0 {
		return "", false
	}
	return t.sessions[t.session[i]], true
}

// SessionOrdinal numbers row i's session_id densely (0 for the first
// session of the file, 1 for the next, ...); -1 when it has none.
func (t *Table) SessionOrdinal(i int) int {
	if t.session == nil {
		return -1
	}
	return int(t.session[i])
}

// Sessions is the number of distinct session ids.
func (t *Table) Sessions() int { return len(t.sessions) }

// ISL is row i's input_length, 0 when absent.
func (t *Table) ISL(i int) int {
	if t.isl[i] == bigCount {
		return t.rare[int32(i)].BigISL
	}
	return max(int(t.isl[i]), 0)
}

// InputLength is row i's input_length; ok is false when it has none.
func (t *Table) InputLength(i int) (n int, ok bool) { return t.ISL(i), t.isl[i] != -1 }

// OSL is row i's output_length, 0 when absent.
func (t *Table) OSL(i int) int {
	if t.osl[i] == bigCount {
		return t.rare[int32(i)].BigOSL
	}
	return max(int(t.osl[i]), 0)
}

// Line is row i's 1-based line in its file (0 if synthesized).
func (t *Table) Line(i int) int { return int(t.line[i]) }

// AppendHashIDs appends row i's hash ids to dst. ok is false when the row
// has no hash_ids key.
func (t *Table) AppendHashIDs(dst []int64, i int) (_ []int64, ok bool) {
	b := t.ids[t.idOff[i]:t.idOff[i+1]]
	n, k := binary.Uvarint(b)
	if n == 0 {
		return dst, false
	}
	b = b[k:]
	var prev int64
	dst = slices.Grow(dst, int(n-1))
	for range n - 1 {
		// Most deltas are small (ids count up by one): one byte, decoded
		// here rather than by a call.
		if u := b[0]; u < 0x80 {
			prev += int64(u>>1) ^ -int64(u&1)
			b = b[1:]
		} else {
			d, k := binary.Varint(b)
			prev += d
			b = b[k:]
		}
		dst = append(dst, prev)
	}
	return dst, true
}

// HashIDCount is the number of row i's hash ids, without decoding them.
func (t *Table) HashIDCount(i int) int {
	n, _ := binary.Uvarint(t.ids[t.idOff[i]:t.idOff[i+1]])
	return max(int(n)-1, 0)
}

// HashIDRange is the smallest and the largest hash id of the table; ok is
// false when it has none.
func (t *Table) HashIDRange() (lo, hi int64, ok bool) {
	return t.loID, t.hiID, t.loID <= t.hiID
}

// Record returns row i as a Record of its own, which the caller may keep
// and modify.
func (t *Table) Record(i int) Record {
	r := Record{Line: t.Line(i)}
	if v, ok := t.Timestamp(i); ok {
		r.Timestamp = &v
	}
	if t.isl[i] != -1 {
		r.InputLength = Ptr(t.ISL(i))
	}
	if t.osl[i] != -1 {
		r.OutputLength = Ptr(t.OSL(i))
	}
	if ids, ok := t.AppendHashIDs(nil, i); ok {
		r.HashIDs = ids
		if ids == nil {
			r.HashIDs = []int64{}
		}
	}
	if s, ok := t.SessionID(i); ok {
		r.SessionID = &s
	}
	if v, ok := t.Delay(i); ok {
		r.Delay = &v
	}
	if x := t.rare[int32(i)]; x != nil {
		r.TextInput, r.Messages, r.Tools = x.TextInput, x.Messages, x.Tools
		r.Payload, r.Extra, r.Type, r.Unknown = x.Payload, x.Extra, x.Type, x.Unknown
	}
	return r
}

// Row is the part of a row that synthesis rewrites, read from a Table or
// appended to one without building a Record.
type Row struct {
	Timestamp float64 // ms; NaN when absent
	ISL, OSL  int     // input_length and output_length; -1 when absent
	HashIDs   []int64
	HasIDs    bool // false: no hash_ids key (HashIDs is then empty)
}

// Row returns row i's rewritable fields; its hash ids are decoded into
// buf[:0], so that a caller walking the table reuses one buffer.
func (t *Table) Row(i int, buf []int64) Row {
	r := Row{Timestamp: t.ts[i], ISL: -1, OSL: -1}
	if t.isl[i] != -1 {
		r.ISL = t.ISL(i)
	}
	if t.osl[i] != -1 {
		r.OSL = t.OSL(i)
	}
	r.HashIDs, r.HasIDs = t.AppendHashIDs(buf[:0], i)
	return r
}

// Bytes is an estimate of the memory the table holds, for reports and tests.
func (t *Table) Bytes() int {
	n := cap(t.ts)*8 + cap(t.isl)*4 + cap(t.osl)*4 + cap(t.line)*4 + cap(t.idOff)*4 + cap(t.ids) +
		cap(t.session)*4 + cap(t.delay)*8
	for _, s := range t.sessions {
		n += len(s) + int(unsafe.Sizeof(s))
	}
	for range t.rare {
		n += int(unsafe.Sizeof(rareFields{})) + 16
	}
	return n
}

// TableBuilder fills a Table row by row.
type TableBuilder struct {
	t         Table
	sessionOf map[string]int32
	scratch   []int64 // hash ids of the row fastRow is reading
}

// NewTableBuilder returns a builder; rows is a capacity hint.
func NewTableBuilder(rows int) *TableBuilder {
	rows = max(rows, 0)
	return &TableBuilder{t: Table{
		loID:  math.MaxInt64,
		hiID:  math.MinInt64,
		ts:    make([]float64, 0, rows),
		isl:   make([]int32, 0, rows),
		osl:   make([]int32, 0, rows),
		line:  make([]int32, 0, rows),
		idOff: append(make([]uint32, 0, rows+1), 0),
	}}
}

// Len is the number of rows appended so far.
func (b *TableBuilder) Len() int { return len(b.t.ts) }

// Append adds r as the next row. It fails on values the columns cannot
// hold (counts or line numbers above 2³¹−1, more than 4 GiB of ids).
func (b *TableBuilder) Append(r *Record) error {
	t := &b.t
	i := len(t.ts)
	if i >= math.MaxInt32 {
		return fmt.Errorf("more than %d rows", math.MaxInt32)
	}
	isl, bigISL, err := column32("input_length", r.InputLength)
	if err != nil {
		return err
	}
	osl, bigOSL, err := column32("output_length", r.OutputLength)
	if err != nil {
		return err
	}
	if r.Line > math.MaxInt32 {
		return fmt.Errorf("line %d is past the last line a table holds", r.Line)
	}
	ts := math.NaN()
	if r.Timestamp != nil {
		ts = *r.Timestamp
	}
	if err := b.appendColumns(r.HashIDs, r.HashIDs != nil, ts, isl, osl, int32(r.Line)); err != nil {
		return err
	}
	if r.SessionID != nil {
		b.appendSession(*r.SessionID, true)
	} else {
		b.appendSession("", false)
	}
	d := math.NaN()
	if r.Delay != nil {
		d = *r.Delay
	}
	b.appendDelay(d, r.Delay != nil)
	if r.TextInput != nil || r.Messages != nil || r.Tools != nil || r.Payload != nil || r.Extra != nil || r.Type != nil || r.Unknown != nil || bigISL+bigOSL > 0 {
		if t.rare == nil {
			t.rare = map[int32]*rareFields{}
		}
		t.rare[int32(i)] = &rareFields{TextInput: r.TextInput, Messages: r.Messages, Tools: r.Tools,
			Payload: r.Payload, Extra: r.Extra, Type: r.Type, Unknown: r.Unknown, BigISL: bigISL, BigOSL: bigOSL}
	}
	return nil
}

// ReserveHashIDs makes room for n more bytes of hash ids, for a caller
// that knows about how many its rows will take: growing the column by
// appending copies it over and over.
func (b *TableBuilder) ReserveHashIDs(n int) {
	b.t.ids = slices.Grow(b.t.ids, n)
}

// HashIDBytes is the size of the hash-id column in bytes.
func (t *Table) HashIDBytes() int { return len(t.ids) }

// AppendEdited appends row i of src with r's fields in place of its own:
// its line, session_id, delay and rare fields are src's. It allocates
// nothing per row beyond the growth of the columns, so that synthesis over
// millions of rows never holds them as Records.
func (b *TableBuilder) AppendEdited(src *Table, i int, r *Row) error {
	t := &b.t
	n := len(t.ts)
	if n >= math.MaxInt32 {
		return fmt.Errorf("more than %d rows", math.MaxInt32)
	}
	isl, bigISL, err := count32("input_length", r.ISL)
	if err != nil {
		return err
	}
	osl, bigOSL, err := count32("output_length", r.OSL)
	if err != nil {
		return err
	}
	if err := b.appendColumns(r.HashIDs, r.HasIDs, r.Timestamp, isl, osl, src.line[i]); err != nil {
		return err
	}
	b.appendSession(src.SessionID(i))
	d := math.NaN()
	if src.delay != nil {
		d = src.delay[i]
	}
	b.appendDelay(d, src.delay != nil)
	x := src.rare[int32(i)]
	if (x == nil && bigISL+bigOSL > 0) || (x != nil && (x.BigISL != bigISL || x.BigOSL != bigOSL)) {
		var c rareFields
		if x != nil {
			c = *x
		}
		c.BigISL, c.BigOSL = bigISL, bigOSL
		x = &c
		if c.onlyCounts() && bigISL+bigOSL == 0 {
			x = nil // only the counts were rare
		}
	}
	if x != nil {
		if t.rare == nil {
			t.rare = map[int32]*rareFields{}
		}
		t.rare[int32(n)] = x // immutable once in a table: shared, not copied
	}
	return nil
}

// appendColumns appends what every row has: its hash ids, timestamp,
// lengths and line. It fails, appending nothing, when the ids would take
// the column past what its offsets address.
func (b *TableBuilder) appendColumns(hashIDs []int64, hasIDs bool, ts float64, isl, osl, line int32) error {
	t := &b.t
	ids := t.encodeIDs(t.ids, hashIDs, hasIDs)
	if len(ids) > math.MaxUint32 {
		return fmt.Errorf("hash_ids take more than %d bytes", uint32(math.MaxUint32))
	}
	t.ids = ids
	t.idOff = append(t.idOff, uint32(len(ids)))
	t.ts = append(t.ts, ts)
	t.isl = append(t.isl, isl)
	t.osl = append(t.osl, osl)
	t.line = append(t.line, line)
	return nil
}

// appendDelay adds the delay of the row just appended (NaN when it has
// none, has false); the column exists from the first row with one on.
func (b *TableBuilder) appendDelay(d float64, has bool) {
	t := &b.t
	if has && t.delay == nil {
		t.delay = backfill(len(t.ts)-1, math.NaN())
	}
	if t.delay != nil {
		t.delay = append(t.delay, d)
	}
}

// appendSession adds the session of the row just appended (ok is false
// when it has none), numbering sessions in their order of first appearance
// in this table.
func (b *TableBuilder) appendSession(id string, ok bool) {
	t := &b.t
	if ok && t.session == nil {
		t.session = backfill(len(t.ts)-1, int32(-1))
		b.sessionOf = map[string]int32{}
	}
	if t.session == nil {
		return
	}
	s := int32(-1)
	if ok {
		var seen bool
		if s, seen = b.sessionOf[id]; !seen {
			s = int32(len(t.sessions))
			t.sessions = append(t.sessions, id)
			b.sessionOf[id] = s
		}
	}
	t.session = append(t.session, s)
}

// HashIDsSize is the bytes a row's hash ids (has: whether it has the key)
// take in a table, for a caller that reserves room for them.
func HashIDsSize(ids []int64, has bool) int {
	if !has {
		return 1
	}
	n := uvarintSize(uint64(len(ids)) + 1)
	var prev int64
	for _, h := range ids {
		d := h - prev
		n += uvarintSize(uint64(d<<1) ^ uint64(d>>63)) // zigzag, as binary.AppendVarint
		prev = h
	}
	return n
}

func uvarintSize(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// encodeIDs appends a row's hash ids (has: whether it has the key) to dst
// as the ids column holds them, and widens the table's id range to them.
func (t *Table) encodeIDs(dst []byte, ids []int64, has bool) []byte {
	if !has {
		return append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(ids))+1)
	var prev int64
	lo, hi := t.loID, t.hiID
	for _, h := range ids {
		dst = binary.AppendVarint(dst, h-prev)
		prev = h
		lo, hi = min(lo, h), max(hi, h)
	}
	t.loID, t.hiID = lo, hi
	return dst
}

// appendPlain appends a row of the common shape: no session, delay or rare
// field; osl -1 when absent. The caller has checked every value.
func (b *TableBuilder) appendPlain(ts float64, isl, osl int32, ids []int64, hasIDs bool, line int) {
	t := &b.t
	t.ids = t.encodeIDs(t.ids, ids, hasIDs)
	t.idOff = append(t.idOff, uint32(len(t.ids)))
	t.ts = append(t.ts, ts)
	t.isl = append(t.isl, isl)
	t.osl = append(t.osl, osl)
	t.line = append(t.line, int32(line))
	if t.session != nil {
		t.session = append(t.session, -1)
	}
	if t.delay != nil {
		t.delay = append(t.delay, math.NaN())
	}
}

// Table returns the rows appended; the builder must not be used after.
func (b *TableBuilder) Table() *Table {
	t := &b.t
	// Trim the growth slack of the big columns: at millions of rows it is
	// tens of megabytes.
	t.ids, t.idOff = trim(t.ids), trim(t.idOff)
	t.ts, t.isl, t.osl, t.line = trim(t.ts), trim(t.isl), trim(t.osl), trim(t.line)
	t.session, t.delay = trim(t.session), trim(t.delay)
	return t
}

// TableOf packs records into a Table.
func TableOf(recs []Record) (*Table, error) {
	b := NewTableBuilder(len(recs))
	for i := range recs {
		if err := b.Append(&recs[i]); err != nil {
			line := recs[i].Line
			if line == 0 {
				line = i + 1
			}
			return nil, &LineError{Line: line, Err: err}
		}
	}
	return b.Table(), nil
}

// Records unpacks every row.
func (t *Table) Records() []Record {
	out := make([]Record, t.Len())
	for i := range out {
		out[i] = t.Record(i)
	}
	return out
}

// column32 is a count as its column holds it: -1 when absent, bigCount
// when it does not fit (big is then the count, for the rare fields).
func column32(key string, v *int) (c int32, big int, err error) {
	switch {
	case v == nil:
		return -1, 0, nil
	case *v < 0:
		return 0, 0, fmt.Errorf("%s %d is negative", key, *v)
	case *v > math.MaxInt32:
		return bigCount, *v, nil
	}
	return int32(*v), 0, nil
}

// count32 is column32 for a count held as an int, negative when absent.
func count32(key string, v int) (c int32, big int, err error) {
	if v < 0 {
		return -1, 0, nil
	}
	return column32(key, &v)
}

func backfill[T any](n int, v T) []T {
	s := make([]T, n, max(2*n, 16))
	for i := range s {
		s[i] = v
	}
	return s
}

func trim[T any](s []T) []T {
	if s == nil || cap(s)-len(s) <= len(s)/16 {
		return s // nil stays nil: absent columns are nil
	}
	return append(make([]T, 0, len(s)), s...)
}

// ReadTable reads every row from r into a Table; name is used in errors and
// size is the input's length in bytes if known (0 if not), from which the
// columns are sized. The rows are checked as ReadAll checks them, but never
// held as Records all at once, and blocks of lines are parsed on all CPUs
// at once: a trace of millions of rows is read in about a second.
func ReadTable(r io.Reader, name string, opts ReadOptions, size int64) (*Table, error) {
	return readTable(r, name, opts, size, 1<<20)
}

// tableChunk is a block of whole lines, parsed by one worker.
type tableChunk struct {
	seq   int
	data  []byte
	line  int // of the line before the block's first
	bytes int
	rows  *Table
	err   error
}

func readTable(r io.Reader, name string, opts ReadOptions, size int64, block int) (*Table, error) {
	workers := max(1, min(runtime.GOMAXPROCS(0), 8))
	// A token per block read and not yet assembled bounds the memory in
	// flight when one block is slow to parse.
	tokens := make(chan struct{}, 2*workers+1)
	jobs := make(chan *tableChunk, workers)
	done := make(chan *tableChunk, workers)
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		defer close(jobs)
		readErr <- splitLines(r, name, block, jobs, tokens, stop)
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range jobs {
				c.rows, c.err = parseLines(c, name, opts)
				c.data = nil
				select {
				case done <- c:
				case <-stop:
					return
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()

	var b *TableBuilder
	var err error
	pending := map[int]*tableChunk{}
	next := 0
	for c := range done {
		pending[c.seq] = c
		for err == nil && pending[next] != nil {
			c := pending[next]
			delete(pending, next)
			next++
			<-tokens
			if err = c.err; err != nil {
				break
			}
			if b == nil {
				b = NewTableBuilder(estimateRows(size, c))
			}
			err = b.appendTable(c.rows)
		}
		if err != nil {
			close(stop)
			for range done { // let the workers go
			}
			break
		}
	}
	if rerr := <-readErr; err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	if b == nil || b.Len() == 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrEmpty)
	}
	return b.Table(), nil
}

// estimateRows sizes the columns from the first block: growing them by
// appending would leave up to a quarter of them unused.
func estimateRows(size int64, first *tableChunk) int {
	if size <= 0 || first.rows.Len() == 0 || first.bytes <= 0 {
		return first.rows.Len()
	}
	return int(float64(size)/float64(first.bytes)*float64(first.rows.Len())*1.02) + 16
}

// splitLines reads r in blocks of whole lines (a line longer than block
// makes its block longer) and hands them out in order.
func splitLines(r io.Reader, name string, block int, jobs chan<- *tableChunk, tokens chan struct{}, stop <-chan struct{}) error {
	var carry []byte
	line := 0
	for seq := 0; ; {
		select {
		case tokens <- struct{}{}:
		case <-stop:
			return nil
		}
		buf := make([]byte, max(block, 2*len(carry)))
		n := copy(buf, carry)
		k, err := io.ReadFull(r, buf[n:])
		buf = buf[:n+k]
		eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !eof {
			<-tokens
			return fmt.Errorf("%s: read after line %d: %w", name, line, err)
		}
		cut := bytes.LastIndexByte(buf, '\n') + 1
		if eof {
			cut = len(buf)
		}
		carry = buf[cut:]
		if cut == 0 && !eof { // no line ends in the block yet: read on
			<-tokens
			continue
		}
		c := &tableChunk{seq: seq, data: buf[:cut], line: line, bytes: cut}
		line += bytes.Count(c.data, []byte{'\n'})
		if len(c.data) == 0 {
			<-tokens
			return nil
		}
		select {
		case jobs <- c:
			seq++
		case <-stop:
			return nil
		}
		if eof {
			return nil
		}
	}
}

// parseLines parses a block's lines into a table of their own.
func parseLines(c *tableChunk, name string, opts ReadOptions) (*Table, error) {
	b := NewTableBuilder(bytes.Count(c.data, []byte{'\n'}) + 1)
	data, line := c.data, c.line
	for len(data) > 0 {
		l := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line++
		l = bytes.TrimSpace(l)
		if len(l) == 0 {
			continue
		}
		// A chunk holds at most a few megabytes of ids: no overflow here.
		if fastRow(l, opts.BlockSize, b, line) {
			continue
		}
		rec, err := ParseRecord(l, opts)
		if err == nil {
			rec.Line = line
			err = b.Append(&rec)
		}
		if err != nil {
			return nil, &LineError{File: name, Line: line, Err: err}
		}
	}
	return &b.t, nil
}

// appendTable appends every row of c, whose line numbers are already the
// file's.
func (b *TableBuilder) appendTable(c *Table) error {
	t := &b.t
	base := len(t.ts)
	if base+c.Len() > math.MaxInt32 {
		return fmt.Errorf("more than %d rows", math.MaxInt32)
	}
	if len(t.ids)+len(c.ids) > math.MaxUint32 {
		return fmt.Errorf("hash_ids take more than %d bytes", uint32(math.MaxUint32))
	}
	off := uint32(len(t.ids))
	t.ids = append(t.ids, c.ids...)
	t.loID, t.hiID = min(t.loID, c.loID), max(t.hiID, c.hiID)
	for _, o := range c.idOff[1:] {
		t.idOff = append(t.idOff, off+o)
	}
	t.ts = append(t.ts, c.ts...)
	t.isl = append(t.isl, c.isl...)
	t.osl = append(t.osl, c.osl...)
	t.line = append(t.line, c.line...)

	if c.session != nil && t.session == nil {
		t.session = backfill(base, int32(-1))
		b.sessionOf = map[string]int32{}
	}
	if t.session != nil {
		for i := range c.Len() {
			s := int32(-1)
			if c.session != nil && c.session[i] >= 0 {
				id := c.sessions[c.session[i]]
				var ok bool
				if s, ok = b.sessionOf[id]; !ok {
					s = int32(len(t.sessions))
					t.sessions = append(t.sessions, id)
					b.sessionOf[id] = s
				}
			}
			t.session = append(t.session, s)
		}
	}
	if c.delay != nil && t.delay == nil {
		t.delay = backfill(base, math.NaN())
	}
	if t.delay != nil {
		if c.delay != nil {
			t.delay = append(t.delay, c.delay...)
		} else {
			for range c.Len() {
				t.delay = append(t.delay, math.NaN())
			}
		}
	}
	for i, x := range c.rare {
		if t.rare == nil {
			t.rare = map[int32]*rareFields{}
		}
		t.rare[int32(base)+i] = x
	}
	return nil
}
