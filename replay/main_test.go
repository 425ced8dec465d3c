package replay

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package starts must have ended when its tests end:
// a stream reader left behind would keep a connection and a body open.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
