package replay

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package starts must have ended when its tests end:
// a dispatcher or request left behind would keep a connection open.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
