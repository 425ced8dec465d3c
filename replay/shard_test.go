package replay

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/trace"
)

// shardTestShare returns the rows (first turns and the turns after them) that
// p's shard sends in one pass.
func shardTestShare(t *testing.T, p *Pacer) []int {
	t.Helper()
	var rows []int
	for {
		it, ok := p.Next()
		if !ok {
			return rows
		}
		for ok {
			rows = append(rows, it.Index)
			it, _, ok = p.NextTurn(it)
		}
	}
}

func TestShardCoversEveryRowOnce(t *testing.T) {
	// Conversations of 1 to 4 turns, interleaved in the file, with
	// unsorted timestamps and some later turns without one.
	rng := rand.New(rand.NewPCG(1, 2))
	var rows []pacerTestRow
	open := []string{}
	for i := 0; len(rows) < 300; i++ {
		if len(open) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(open))
			ts := float64(rng.IntN(100000))
			if rng.IntN(3) == 0 {
				ts = -1
			}
			rows = append(rows, pacerTestRow{ts: ts, sid: open[k]})
			if rng.IntN(3) == 0 {
				open = append(open[:k], open[k+1:]...)
			}
			continue
		}
		row := pacerTestRow{ts: float64(rng.IntN(100000))}
		if rng.IntN(2) == 0 {
			row.sid = fmt.Sprintf("s%d", i)
			open = append(open, row.sid)
		}
		rows = append(rows, row)
	}
	recs := pacerTestRecords(rows...)

	for count := 1; count <= 5; count++ {
		t.Run(fmt.Sprint(count), func(t *testing.T) {
			seen := make([]int, len(recs))   // times each row was sent
			owner := map[string]int{}        // session → shard
			shareConvs := make([]int, count) // conversations per shard
			for index := range count {
				p, err := NewPacer(recs, PacerOptions{Loop: LoopOnce, Shard: Shard{Index: index, Count: count}})
				if err != nil {
					t.Fatal(err)
				}
				share := shardTestShare(t, p)
				if got := p.PassRows(0); got != len(share) {
					t.Errorf("shard %d: PassRows(0) = %d, but it sent %d rows", index, got, len(share))
				}
				for _, r := range share {
					seen[r]++
					if sid := recs[r].SessionID; sid != nil {
						if o, ok := owner[*sid]; ok && o != index {
							t.Errorf("session %s split between shards %d and %d", *sid, o, index)
						}
						owner[*sid] = index
					}
					if recs[r].SessionID == nil || r == shardTestFirstRow(recs, *recs[r].SessionID) {
						shareConvs[index]++
					}
				}
			}
			for r, n := range seen {
				if n != 1 {
					t.Errorf("row %d sent %d times, want once", r, n)
				}
			}
			lo, hi := shareConvs[0], shareConvs[0]
			for _, n := range shareConvs {
				lo, hi = min(lo, n), max(hi, n)
			}
			if hi-lo > 1 {
				t.Errorf("conversations per shard %v: unbalanced by more than one", shareConvs)
			}
		})
	}
}

func shardTestFirstRow(recs []trace.Record, sid string) int {
	for i := range recs {
		if s := recs[i].SessionID; s != nil && *s == sid {
			return i
		}
	}
	return -1
}

func TestShardValidate(t *testing.T) {
	for _, tc := range []struct {
		s  Shard
		ok bool
	}{
		{Shard{0, 1}, true},
		{Shard{4, 5}, true},
		{Shard{0, 0}, false},
		{Shard{1, 1}, false},
		{Shard{-1, 3}, false},
	} {
		if err := tc.s.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v.Validate() = %v, want ok %v", tc.s, err, tc.ok)
		}
	}
	for from := range 12 {
		for _, s := range []Shard{{0, 1}, {1, 3}, {2, 3}, {3, 4}} {
			c := s.firstOwned(from)
			if c < from || !s.Owns(c) || c-from >= s.Count {
				t.Errorf("%+v.firstOwned(%d) = %d", s, from, c)
			}
		}
	}
}
