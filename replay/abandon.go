package replay

import (
	"math/rand/v2"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/openai"
)

// Abandonment picks the requests whose stream the client closes early
// (workloads[].abandon): a Share of the trace's rows, drawn from Seed and
// each row's index, so that the same rows are abandoned on every pass, run
// and replica.
type Abandonment struct {
	Share float64        // 0 abandons none, 1 every request
	Seed  uint64         // the workload's seed
	When  openai.Abandon // when a picked request's stream is closed
}

// Picks tells whether the request of row index is abandoned.
func (a Abandonment) Picks(index int) bool {
	if a.Share <= 0 || !a.When.Set() {
		return false
	}
	seed := rng.Seed(a.Seed, "abandon")
	u := rand.New(rand.NewPCG(seed, uint64(index))).Float64()
	return u < a.Share
}
