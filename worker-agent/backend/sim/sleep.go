package sim

import (
	"context"
	"time"
)

// fineMargin is how much of a sleep is left to sleepUntil rather than a Go timer. Go
// wakes its timers through epoll_wait, whose timeout is whole milliseconds, so a timer
// fires up to a millisecond late (golang/go#44343): 0.9–1.1 ms for a 2.5 ms sleep on
// the development machine (BenchmarkSleepLateness). At --time-scale 0.05 that reads as
// 18–22 ms at scale 1, two fifths of the seed's 50 ms run, and hid routing's gain.
// The margin covers the timer's lateness with room for a busy host.
const fineMargin = 2 * time.Millisecond

// preciseSleep waits d. A cancelled ctx ends it early, except in the last fineMargin,
// which is slept uninterrupted.
func preciseSleep(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	if d > fineMargin {
		if err := timerSleep(ctx, d-fineMargin); err != nil {
			return err
		}
	} else if err := ctx.Err(); err != nil {
		return err
	}
	sleepUntil(deadline)
	return nil
}

func timerSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
