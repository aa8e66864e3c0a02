package sim

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPreciseSleepNeverEndsEarly(t *testing.T) {
	t.Parallel()
	// Below the margin (nanosleep alone) and above it (a timer, then nanosleep).
	for _, d := range []time.Duration{300 * time.Microsecond, fineMargin + 700*time.Microsecond} {
		start := time.Now()
		if err := preciseSleep(t.Context(), d); err != nil {
			t.Fatalf("preciseSleep(%s) = %v", d, err)
		}
		if got := time.Since(start); got < d {
			t.Errorf("preciseSleep(%s) returned after %s", d, got)
		}
	}
}

func TestPreciseSleepStopsOnCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	// An hour: returning at all shows the timer part was cut short.
	for _, d := range []time.Duration{time.Hour, fineMargin / 2} {
		if err := preciseSleep(ctx, d); !errors.Is(err, context.Canceled) {
			t.Errorf("preciseSleep(cancelled, %s) = %v, want context.Canceled", d, err)
		}
	}
}

// BenchmarkSleepLateness reports how late each way of sleeping wakes for the seed's
// 50 ms run at --time-scale 0.05 (late-µs/op).
func BenchmarkSleepLateness(b *testing.B) {
	const d = 2500 * time.Microsecond
	for _, s := range []struct {
		name  string
		sleep func(context.Context, time.Duration) error
	}{{"timer", timerSleep}, {"precise", preciseSleep}} {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			var late time.Duration
			for b.Loop() {
				start := time.Now()
				if err := s.sleep(b.Context(), d); err != nil {
					b.Fatal(err)
				}
				late += time.Since(start) - d
			}
			b.ReportMetric(float64(late.Microseconds())/float64(b.N), "late-µs/op")
		})
	}
}
