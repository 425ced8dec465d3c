package testutil

import "go.uber.org/goleak"

// LeakOptions are the goleak options every package's leak check takes.
// fasthttp's HostClient (the engine clients' fast sender) cleans its idle
// connections on a goroutine of its own, which ends by itself at most
// its idle duration after the client has no connection left; the
// daemon's own goroutines end when it stops.
func LeakOptions(opts ...goleak.Option) []goleak.Option {
	return append(opts, goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"))
}
