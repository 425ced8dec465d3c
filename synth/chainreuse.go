package synth

import (
	"fmt"

	"github.com/kvload-exporter/kvload-exporter/idealcache"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// ChainReuseOf counts the rows of rows that reuse a hash id after another
// chain of blocks than where it first appeared (idealcache.ChainReuse), in
// file order. An engine's prefix cache keys a block by its whole prefix,
// so it serves those rows less than their theoretical hit rate, which
// counts by id (AIPerf's and datagen's definition), says. It holds 4 bytes
// an id of the trace's id span while it runs.
func ChainReuseOf(rows *trace.Table) *idealcache.ChainReuse {
	c := newChainReuse(rows)
	var ids []int64
	for r := range rows.Len() {
		ids, _ = rows.AppendHashIDs(ids[:0], r)
		c.Row(ids, rows.Line(r))
	}
	return c
}

// newChainReuse returns the check of rows' ids: in a slice over their span
// where that is at most twice the table's size, else in a map.
func newChainReuse(rows *trace.Table) *idealcache.ChainReuse {
	lo, hi, ok := rows.HashIDRange()
	if !ok {
		return idealcache.NewChainReuse(0, -1, false)
	}
	span := hi - lo
	return idealcache.NewChainReuse(lo, hi, span >= 0 && span <= int64(rows.Bytes())/2+1<<20)
}

// ChainReuseNote says that reusing of rows rows use a hash id after another
// chain of blocks than where it first came, the first at where (a line or
// a row), and what that means for the hit rates.
func ChainReuseNote(reusing, rows int, where string) string {
	return fmt.Sprintf("%s of %s rows use a hash id after another chain of blocks than where it first came (the first at %s): "+
		"an engine's prefix cache keys a block by its whole prefix, so it can serve less than a hit rate counted by id (AIPerf's, datagen's) says; "+
		"the exporter's model keys blocks as the engine does",
		groupThousands(reusing), groupThousands(rows), where)
}
