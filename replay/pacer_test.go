package replay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// pacerTestRow describes a trace row: ts < 0 means no timestamp.
type pacerTestRow struct {
	ts    float64
	sid   string
	delay float64 // ms; 0 means absent
}

func pacerTestRecords(rows ...pacerTestRow) []trace.Record {
	recs := make([]trace.Record, len(rows))
	for i, r := range rows {
		recs[i] = trace.Record{Line: i + 1, InputLength: trace.Ptr(100), HashIDs: []int64{int64(i)}}
		if r.ts >= 0 {
			recs[i].Timestamp = trace.Ptr(r.ts)
		}
		if r.sid != "" {
			recs[i].SessionID = trace.Ptr(r.sid)
		}
		if r.delay != 0 {
			recs[i].Delay = trace.Ptr(r.delay)
		}
	}
	return recs
}

func pacerTestTimestamps(ts ...float64) []trace.Record {
	rows := make([]pacerTestRow, len(ts))
	for i, t := range ts {
		rows[i] = pacerTestRow{ts: t}
	}
	return pacerTestRecords(rows...)
}

// pacerTestItem is the part of a PacerItem the tables spell out.
type pacerTestItem struct {
	pass, index int
	due         time.Duration
	ns          uint64
}

// pacerTestTick is the trace's time unit, one millisecond.
const pacerTestTick = time.Millisecond

func TestPacerNext(t *testing.T) {
	for _, tc := range []struct {
		name   string
		recs   []trace.Record
		opts   PacerOptions
		want   []pacerTestItem
		period time.Duration
		ends   bool // Next returns false after want
	}{
		{
			name: "sorted, repeat; next pass after the mean gap",
			recs: pacerTestTimestamps(0, 10, 30),
			opts: PacerOptions{Loop: LoopRepeat},
			want: []pacerTestItem{
				{0, 0, 0, 0}, {0, 1, 10 * pacerTestTick, 0}, {0, 2, 30 * pacerTestTick, 0},
				{1, 0, 45 * pacerTestTick, 0}, {1, 1, 55 * pacerTestTick, 0}, {1, 2, 75 * pacerTestTick, 0},
				{2, 0, 90 * pacerTestTick, 0},
			},
			period: 45 * pacerTestTick,
		},
		{
			name: "unsorted with ties: stable, zero at the minimum",
			recs: pacerTestTimestamps(20, 5, 20, 5),
			opts: PacerOptions{Loop: LoopOnce},
			want: []pacerTestItem{
				{0, 1, 0, 0}, {0, 3, 0, 0}, {0, 0, 15 * pacerTestTick, 0}, {0, 2, 15 * pacerTestTick, 0},
			},
			period: 20 * pacerTestTick,
			ends:   true,
		},
		{
			name:   "speedup divides the time axis",
			recs:   pacerTestTimestamps(100, 300, 500.5),
			opts:   PacerOptions{SpeedupRatio: 4, Loop: LoopOnce},
			want:   []pacerTestItem{{0, 0, 0, 0}, {0, 1, 50 * pacerTestTick, 0}, {0, 2, 100*pacerTestTick + 125*time.Microsecond, 0}},
			period: 150*pacerTestTick + 187500*time.Nanosecond,
			ends:   true,
		},
		{
			name: "fresh: a namespace per pass",
			recs: pacerTestTimestamps(0, 10),
			opts: PacerOptions{Loop: LoopFresh},
			want: []pacerTestItem{
				{0, 0, 0, 0}, {0, 1, 10 * pacerTestTick, 0}, {1, 0, 20 * pacerTestTick, 1}, {1, 1, 30 * pacerTestTick, 1}, {2, 0, 40 * pacerTestTick, 2},
			},
			period: 20 * pacerTestTick,
		},
		{
			name:   "default loop is fresh",
			recs:   pacerTestTimestamps(0, 10),
			want:   []pacerTestItem{{0, 0, 0, 0}, {0, 1, 10 * pacerTestTick, 0}, {1, 0, 20 * pacerTestTick, 1}},
			period: 20 * pacerTestTick,
		},
		{
			name: "sessions: only first turns, ordered by them",
			recs: pacerTestRecords(
				pacerTestRow{ts: 40, sid: "a"},
				pacerTestRow{ts: 5, sid: "b"},
				pacerTestRow{ts: -1, sid: "a"},
				pacerTestRow{ts: 90, sid: "a"},
				pacerTestRow{ts: 10},
			),
			opts:   PacerOptions{Loop: LoopOnce},
			want:   []pacerTestItem{{0, 1, 0, 0}, {0, 4, 5 * pacerTestTick, 0}, {0, 0, 35 * pacerTestTick, 0}},
			period: 85*pacerTestTick + 85*pacerTestTick/3, // last timed row at 85 pacerTestTick, 4 timed rows
			ends:   true,
		},
		{
			name: "shard 1 of 2 takes every other conversation",
			recs: pacerTestTimestamps(0, 10, 20, 30, 40),
			opts: PacerOptions{Loop: LoopRepeat, Shard: Shard{Index: 1, Count: 2}},
			want: []pacerTestItem{
				{0, 1, 10 * pacerTestTick, 0}, {0, 3, 30 * pacerTestTick, 0}, {1, 1, 60 * pacerTestTick, 0}, {1, 3, 80 * pacerTestTick, 0},
			},
			period: 50 * pacerTestTick,
		},
		{
			name: "equal timestamps: one pass a second",
			recs: pacerTestTimestamps(7, 7),
			opts: PacerOptions{Loop: LoopRepeat},
			want: []pacerTestItem{
				{0, 0, 0, 0}, {0, 1, 0, 0}, {1, 0, time.Second, 0}, {1, 1, time.Second, 0},
			},
			period: time.Second,
		},
		{
			name:   "empty share ends at once",
			recs:   pacerTestTimestamps(0),
			opts:   PacerOptions{Shard: Shard{Index: 1, Count: 2}},
			period: time.Second,
			ends:   true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPacer(tc.recs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if p.Period() != tc.period {
				t.Errorf("Period() = %v, want %v", p.Period(), tc.period)
			}
			for i, w := range tc.want {
				it, ok := p.Next()
				if !ok {
					t.Fatalf("item %d: Next ended early", i)
				}
				got := pacerTestItem{it.Pass, it.Index, it.Due, it.Namespace}
				if got != w {
					t.Errorf("item %d = %+v, want %+v", i, got, w)
				}
				if it.Turn != 0 {
					t.Errorf("item %d: Turn = %d, want 0", i, it.Turn)
				}
			}
			if _, ok := p.Next(); ok == tc.ends {
				t.Errorf("after %d items Next ok = %v, want %v", len(tc.want), ok, !tc.ends)
			}
		})
	}
}

func TestPacerNextTurn(t *testing.T) {
	recs := pacerTestRecords(
		pacerTestRow{ts: 0, sid: "a"},
		pacerTestRow{ts: 20},
		pacerTestRow{ts: -1, sid: "a", delay: 500},
		pacerTestRow{ts: 50, sid: "a"},
	)
	p, err := NewPacer(recs, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	period := p.Period() // 50 pacerTestTick + 50/2 pacerTestTick
	if period != 75*pacerTestTick {
		t.Fatalf("Period() = %v, want 75ms", period)
	}
	first := PacerItem{Pass: 1, Index: 0, Due: period, Namespace: 1, Conv: 0}
	for _, tc := range []struct {
		from         PacerItem
		wantIndex    int
		wantDue      time.Duration
		wantTimed    bool
		wantOK       bool
		wantTurn     int
		wantDelay    time.Duration
		wantNamspace uint64
	}{
		{from: first, wantIndex: 2, wantTimed: false, wantOK: true, wantTurn: 1, wantDelay: 500 * pacerTestTick, wantNamspace: 1},
		{from: PacerItem{Pass: 1, Index: 2, Namespace: 1, Turn: 1}, wantIndex: 3, wantDue: period + 50*pacerTestTick, wantTimed: true, wantOK: true, wantTurn: 2, wantNamspace: 1},
		{from: PacerItem{Pass: 1, Index: 3, Namespace: 1, Turn: 2}, wantOK: false},
		{from: PacerItem{Index: 1}, wantOK: false},
	} {
		next, timed, ok := p.NextTurn(tc.from)
		if ok != tc.wantOK {
			t.Errorf("NextTurn(row %d) ok = %v, want %v", tc.from.Index, ok, tc.wantOK)
			continue
		}
		if !ok {
			continue
		}
		if next.Index != tc.wantIndex || next.Due != tc.wantDue || timed != tc.wantTimed || next.Turn != tc.wantTurn ||
			next.Namespace != tc.wantNamspace || next.Pass != tc.from.Pass {
			t.Errorf("NextTurn(row %d) = %+v timed %v, want index %d due %v timed %v turn %d",
				tc.from.Index, next, timed, tc.wantIndex, tc.wantDue, tc.wantTimed, tc.wantTurn)
		}
		if d := p.Delay(next.Index); d != tc.wantDelay {
			t.Errorf("Delay(%d) = %v, want %v", next.Index, d, tc.wantDelay)
		}
	}
}

func TestPacerSeek(t *testing.T) {
	recs := pacerTestTimestamps(0, 10, 20, 30) // period 40 pacerTestTick
	p, err := NewPacer(recs, PacerOptions{Loop: LoopFresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Seek(TracePosition{Pass: 1, Conv: 2}); err != nil {
		t.Fatal(err)
	}
	if got := p.PassRows(1); got != 2 {
		t.Errorf("PassRows(1) = %d, want 2 (rest of the pass)", got)
	}
	if got := p.PassRows(2); got != 4 {
		t.Errorf("PassRows(2) = %d, want 4", got)
	}
	if got := p.PassRows(0); got != 0 {
		t.Errorf("PassRows(0) = %d, want 0 (before the seek)", got)
	}
	want := []struct {
		item pacerTestItem
		pos  TracePosition // after the item
	}{
		{pacerTestItem{1, 2, 0, 1}, TracePosition{1, 3}},
		{pacerTestItem{1, 3, 10 * pacerTestTick, 1}, TracePosition{2, 0}},
		{pacerTestItem{2, 0, 20 * pacerTestTick, 2}, TracePosition{2, 1}},
	}
	for i, w := range want {
		it, ok := p.Next()
		if !ok {
			t.Fatal("Next ended")
		}
		if got := (pacerTestItem{it.Pass, it.Index, it.Due, it.Namespace}); got != w.item {
			t.Errorf("item %d = %+v, want %+v", i, got, w.item)
		}
		if got := p.Position(); got != w.pos {
			t.Errorf("Position after item %d = %+v, want %+v", i, got, w.pos)
		}
	}

	for _, tc := range []struct {
		name string
		opts PacerOptions
		pos  TracePosition
		err  bool
		ok   bool // Next yields something after the seek
	}{
		{name: "end of pass is the next pass", opts: PacerOptions{Loop: LoopRepeat}, pos: TracePosition{0, 4}, ok: true},
		{name: "once past its pass", opts: PacerOptions{Loop: LoopOnce}, pos: TracePosition{0, 4}},
		{name: "conv out of range", pos: TracePosition{0, 5}, err: true},
		{name: "negative pass", pos: TracePosition{-1, 0}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPacer(recs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			err = p.Seek(tc.pos)
			if (err != nil) != tc.err {
				t.Fatalf("Seek error = %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			it, ok := p.Next()
			if ok != tc.ok {
				t.Fatalf("Next ok = %v, want %v", ok, tc.ok)
			}
			if ok && it.Due != 0 {
				t.Errorf("first Due after Seek = %v, want 0", it.Due)
			}
		})
	}
}

func TestNewPacerErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		recs []trace.Record
		opts PacerOptions
		want string // substring of the error
	}{
		{
			name: "first turn without timestamp names file and line",
			recs: pacerTestRecords(pacerTestRow{ts: 0}, pacerTestRow{ts: 5, sid: "x"}, pacerTestRow{ts: -1, sid: "y"}),
			opts: PacerOptions{Trace: "t.jsonl"},
			want: `t.jsonl:3: first turn of session "y" has no timestamp`,
		},
		{
			name: "row without timestamp",
			recs: pacerTestRecords(pacerTestRow{ts: -1}),
			opts: PacerOptions{Trace: "t.jsonl"},
			want: "t.jsonl:1: row has no timestamp",
		},
		{
			name: "negative delay",
			recs: pacerTestRecords(pacerTestRow{ts: 0, sid: "a"}, pacerTestRow{ts: -1, sid: "a", delay: -3}),
			want: ":2: delay must not be negative",
		},
		{name: "negative speedup", recs: pacerTestTimestamps(0), opts: PacerOptions{SpeedupRatio: -1}, want: "speedup ratio"},
		{name: "unknown loop", recs: pacerTestTimestamps(0), opts: PacerOptions{Loop: "forever"}, want: `unknown loop mode "forever"`},
		{name: "shard index", recs: pacerTestTimestamps(0), opts: PacerOptions{Shard: Shard{Index: 2, Count: 2}}, want: "shard index must be in 0..1"},
		{name: "shard count", recs: pacerTestTimestamps(0), opts: PacerOptions{Shard: Shard{Index: 0, Count: -1}}, want: "shard count"},
		{name: "no rows", want: "no rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPacer(tc.recs, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}

	_, err := NewPacer(pacerTestRecords(pacerTestRow{ts: -1}), PacerOptions{})
	var le *trace.LineError
	if !errors.As(err, &le) || le.Line != 1 {
		t.Errorf("error %v is not a *trace.LineError for line 1", err)
	}
}
