//go:build race

package main

// raceEnabled lets the end-to-end tests replay less under the race
// detector, which slows tokenizing about tenfold, and skip the heaviest.
const raceEnabled = true
