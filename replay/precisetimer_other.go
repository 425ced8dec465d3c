//go:build !linux

package replay

func newPreciseTimer() DispatchTimer { return newRuntimeTimer() }
