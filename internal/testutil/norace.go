//go:build !race

package testutil

// RaceEnabled is false: the binary runs without the race detector (see race.go).
const RaceEnabled = false
