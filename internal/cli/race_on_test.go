//go:build race

package cli

// raceEnabled lets the end-to-end tests replay less under the race
// detector, which slows tokenizing about tenfold, and skip the heaviest.
const raceEnabled = true
