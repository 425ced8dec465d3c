package dashtest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel stop the child if the test binary dies
// without running its cleanups (go test -timeout panics, SIGKILL).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
