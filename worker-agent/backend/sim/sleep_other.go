//go:build !linux

package sim

import "time"

// sleepUntil waits with a Go timer where nanosleep is not in package syscall.
func sleepUntil(deadline time.Time) {
	if left := time.Until(deadline); left > 0 {
		time.Sleep(left)
	}
}
