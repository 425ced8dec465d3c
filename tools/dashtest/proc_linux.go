package dashtest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel stop the child if the test binary dies
// without running its cleanups (go test -timeout panics, SIGKILL). The
// child leads its own process group, so that killGroup reaches what it
// started itself (Ollama's model runners).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// killGroup kills the child and everything in its process group at once,
// as a crashed container would lose them.
func killGroup(cmd *exec.Cmd) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
