package sim

import (
	"errors"
	"syscall"
	"time"
)

// sleepUntil blocks this goroutine's thread in nanosleep until deadline: preciseSleep
// is 0.15–0.4 ms late with it on the development machine. The runtime hands the
// thread's P to other goroutines while it sleeps.
func sleepUntil(deadline time.Time) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(left))
		// A signal (the runtime's preemption among them) ends it early with EINTR:
		// sleep what is left.
		if err := syscall.Nanosleep(&ts, nil); !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}
