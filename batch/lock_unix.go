//go:build unix

package batch

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes f's exclusive advisory lock without waiting; it is released when f
// is closed, or the process dies. errLocked when another holds it.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errLocked
	}
	return err
}
