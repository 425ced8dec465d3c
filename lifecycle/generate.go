package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/synth"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// generatedName names the rows of a generator in the trace cache and in
// messages: equal parameters, equal rows.
func generatedName(g *synth.SharedPrefix) string {
	return fmt.Sprintf("generate%+v", *g)
}

// fileOf returns the rows of w: its trace file as read (readFile), or, for
// a workload with a generator, the generated rows, made once for its
// parameters and kept as a file is.
func (c *traceCache) fileOf(ctx context.Context, old *parsedFile, fk fileKey, w *config.Workload) (*parsedFile, error) {
	g := w.SharedPrefix()
	if g == nil {
		return c.readFile(ctx, old, fk)
	}
	if old != nil {
		return old, nil // the key holds every parameter
	}
	c.stats.parses.Add(1)
	b := trace.NewTableBuilder(g.Requests)
	err := synth.GenerateSharedPrefix(*g, func(r *trace.Record) error {
		if b.Len()%ctxCheckRows == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		return b.Append(r)
	})
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	sum := sha256.Sum256([]byte(fk.path))
	return &parsedFile{hash: hex.EncodeToString(sum[:]), rows: b.Table()}, nil
}

// ctxCheckRows is how often (in rows) generation checks for cancellation.
const ctxCheckRows = 4096
