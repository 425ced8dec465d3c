//go:build !linux

package dashtest

import "os/exec"

// dieWithParent is Linux-only (Pdeathsig); elsewhere the test's cleanups
// are the only way children are stopped.
func dieWithParent(*exec.Cmd) {}

// killGroup kills the child alone: process groups are Linux-only here.
func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
