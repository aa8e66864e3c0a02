package frame

import (
	"testing"
	"time"
)

func TestReadDeadlineExtendsLazily(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	var set []time.Time
	d := NewReadDeadline(func(t time.Time) error { set = append(set, t); return nil })
	d.now = func() time.Time { return now }
	d.since = func(t time.Time) time.Duration { return now.Sub(t) }

	d.Extend(80 * time.Second) // first: always set
	now = t0.Add(9 * time.Second)
	d.Extend(80 * time.Second) // within an eighth: skipped
	now = t0.Add(10 * time.Second)
	d.Extend(80 * time.Second) // an eighth later: set
	d.Extend(5 * time.Second)  // another timeout: set at once
	want := []time.Time{t0.Add(80 * time.Second), t0.Add(90 * time.Second), t0.Add(15 * time.Second)}
	if len(set) != len(want) {
		t.Fatalf("deadlines set %v, want %v", set, want)
	}
	for i := range want {
		if !set[i].Equal(want[i]) {
			t.Fatalf("deadlines set %v, want %v", set, want)
		}
	}
}

// BenchmarkReadDeadlineExtend is the check made for every frame read: the deadline
// itself is set once in an eighth of the timeout.
func BenchmarkReadDeadlineExtend(b *testing.B) {
	d := NewReadDeadline(func(time.Time) error { return nil })
	b.ReportAllocs()
	for b.Loop() {
		_ = d.Extend(time.Minute)
	}
}
