//go:build !race

package prompt

// raceEnabled: see prompt_race_test.go.
const raceEnabled = false
