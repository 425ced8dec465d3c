//go:build race

package testutil

// RaceEnabled tells whether the test binary runs under the race detector,
// which slows some work about tenfold: the slowest tests sample less there.
const RaceEnabled = true
