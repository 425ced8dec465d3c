// Package testutil is the test kit shared by the daemon's tests: polling
// until a condition holds, waiting on an event, a fake clock, reading
// Prometheus metrics, a fake OpenAI-compatible server, a server that never
// answers, a log buffer safe to read while it is written, whether the race
// detector is on, a check that a shared trace is present (NeedShared) and
// AIPerf's documented example rows.
//
// It imports no package of this module, so that the tests of any of them,
// the internal tests of the packages that config and emulate build on
// included, can use it. What needs the configuration schema or the
// emulator is in testutil/daemontest.
//
// No helper here asserts speed: every wait ends when its event happens,
// and is bounded only by the test binary's deadline (go test -timeout),
// or by Ceiling where the binary has none.
package testutil
