//go:build linux

package live

import "syscall"

// sysProcAttr puts a child in a process group of its own, and has the kernel kill it
// should the benchmark die without stopping it (SIGKILL leaves no time to clean up).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
