//go:build unix

package live

import (
	"errors"
	"os"
	"syscall"
)

// terminateGroup sends SIGTERM to p's process group.
func terminateGroup(p *os.Process) error { return signalGroup(p, syscall.SIGTERM) }

// killGroup sends SIGKILL to p's process group.
func killGroup(p *os.Process) error { return signalGroup(p, syscall.SIGKILL) }

func signalGroup(p *os.Process, sig syscall.Signal) error {
	if p == nil {
		return nil
	}
	// The child is its group's leader (Setpgid), so its pid names the group.
	err := syscall.Kill(-p.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil // the group is gone already
	}
	return err
}
