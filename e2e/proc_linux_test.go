//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
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

// binDirLock is held open for the life of the test binary: its flock says binDir is
// in use, and the kernel drops it when the binary dies.
var binDirLock *os.File

// claimBinDir locks dir for this test binary, then marks it claimed, so that a later
// run's removeStaleBinDirs can tell when its owner is gone.
func claimBinDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return err
	}
	binDirLock = f
	return os.WriteFile(filepath.Join(dir, claimedMarker), nil, 0o644)
}

// removeStaleBinDirs removes the binaries of earlier runs that died before TestMain
// removed them (a -timeout panic, a kill): claimed, and no longer locked.
func removeStaleBinDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), binDirPrefix+"*"))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, claimedMarker)); err != nil {
			continue // not claimed: another run between creating and claiming it
		}
		f, err := os.Open(d)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(d)
		}
		f.Close()
	}
}
