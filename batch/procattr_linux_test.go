//go:build linux

package batch

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel SIGKILL the child when the test binary dies, however it
// dies: a -timeout panic or a kill ends the binary without running t.Cleanup, and the
// child would run on. (Strictly the signal follows the thread that started the
// child; the Go runtime ends a thread only when a goroutine that locked it exits, and
// no test here locks one.)
func dieWithTest(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return cmd
}
