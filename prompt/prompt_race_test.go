//go:build race

package prompt

// raceEnabled lets the slowest tests sample less under the race detector,
// which slows tokenizing about tenfold.
const raceEnabled = true
