//go:build race

package synth

// raceEnabled lets the slowest tests sample less under the race detector,
// which slows tokenizing about tenfold.
const raceEnabled = true
