// Package testutil is the test kit shared by the module's tests. Only
// _test.go files import it.
package testutil
