package synth

import (
	"fmt"
	"slices"
	"strings"
)

// Arrivals is how an open-loop rate spaces what arrives at it: the
// requests of a replay schedule (workloads[].schedule.arrivals) and the
// sessions of a generated workload (workloads[].generate.arrivals). It
// lives here, below replay, so that both take the one type.
type Arrivals string

// The arrival processes. The zero value means ArrivalsPoisson.
const (
	// ArrivalsPoisson draws exponential gaps, as a large population of
	// independent users gives: a Poisson process, seeded.
	ArrivalsPoisson Arrivals = "poisson"
	// ArrivalsConstant spaces arrivals evenly, 1/rate apart.
	ArrivalsConstant Arrivals = "constant"
)

// ArrivalProcesses lists every arrival process, for validation and help
// texts.
var ArrivalProcesses = [...]Arrivals{ArrivalsPoisson, ArrivalsConstant}

// Validate reports a value outside ArrivalProcesses; empty is the default
// and valid. The message names the value, not the key: callers know
// which spelling the user wrote.
func (a Arrivals) Validate() error {
	if a == "" || slices.Contains(ArrivalProcesses[:], a) {
		return nil
	}
	names := make([]string, len(ArrivalProcesses))
	for i, p := range ArrivalProcesses {
		names[i] = string(p)
	}
	return fmt.Errorf("%q is not one of %s", string(a), strings.Join(names, ", "))
}

// OrDefault is a, or ArrivalsPoisson when a is empty.
func (a Arrivals) OrDefault() Arrivals {
	if a == "" {
		return ArrivalsPoisson
	}
	return a
}
