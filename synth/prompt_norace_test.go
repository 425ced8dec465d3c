//go:build !race

package synth

// raceEnabled: see prompt_race_test.go.
const raceEnabled = false
