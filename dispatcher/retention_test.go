package dispatcher

import (
	"fmt"
	"testing"
	"time"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

func answered(id string, at time.Time) *taskRecord {
	return &taskRecord{sched: scheduler.Task{ID: id}, status: statusCompleted, finishedAt: at}
}

func TestRetentionExpiresByAnswerTime(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	clock := &testClock{}
	r := newRetention(time.Minute, 10, 1<<30, clock)
	r.add(answered("a", t0))
	r.add(answered("b", t0.Add(30*time.Second)))
	if _, ok := getAt(r, clock, "a", t0.Add(59*time.Second)); !ok {
		t.Fatal("a gone before its retention")
	}
	if _, ok := getAt(r, clock, "a", t0.Add(time.Minute)); ok {
		t.Fatal("a still served after its retention")
	}
	// A lookup does not refresh: a is still the oldest and the first to go.
	if n := r.sweep(t0.Add(time.Minute)); n != 1 || r.len() != 1 {
		t.Fatalf("sweep dropped %d, %d left; want 1 dropped, 1 left", n, r.len())
	}
	if _, ok := getAt(r, clock, "b", t0.Add(time.Minute)); !ok {
		t.Fatal("sweep dropped b, which is within its retention")
	}
}

func TestRetentionCountDropsOldest(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	clock := &testClock{}
	r := newRetention(time.Hour, 3, 1<<30, clock)
	for i := range 5 {
		r.add(answered(fmt.Sprint(i), t0))
	}
	for i, want := range []bool{false, false, true, true, true} {
		if _, ok := getAt(r, clock, fmt.Sprint(i), t0); ok != want {
			t.Errorf("task %d kept=%v, want %v", i, ok, want)
		}
	}
}

// The bytes the kept answers hold are bounded too: large results push the oldest out,
// the accounting follows every way a record leaves (the bound, the sweep, a
// replacement), and the drops are noted for the journal lookup.
func TestRetentionBytesDropOldest(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	clock := &testClock{}
	r := newRetention(time.Minute, 100, 3*(1000+512+1), clock)
	big := func(id string, at time.Time) *taskRecord {
		rec := answered(id, at)
		rec.result = make([]byte, 1000)
		return rec
	}
	for i := range 5 {
		r.add(big(fmt.Sprint(i), t0.Add(time.Duration(i)*time.Second)))
	}
	for i, want := range []bool{false, false, true, true, true} {
		if _, ok := getAt(r, clock, fmt.Sprint(i), t0); ok != want {
			t.Errorf("task %d kept=%v, want %v", i, ok, want)
		}
	}
	if r.bytes != 3*(1000+512+1) {
		t.Errorf("accounted %d bytes for 3 records of 1513", r.bytes)
	}
	if !r.mayHaveDropped(t0.Add(time.Second)) {
		t.Error("a record dropped early within its retention is not noted")
	}
	r.add(big("4", t0.Add(5*time.Second))) // replaces 4
	if r.sweep(t0.Add(time.Minute+3*time.Second)) != 2 || r.len() != 1 || r.bytes != 1000+512+1 {
		t.Errorf("after a replacement and a sweep: %d records, %d bytes; want 1 and 1513", r.len(), r.bytes)
	}
}

func TestRetentionSweepIsBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	clock := &testClock{}
	r := newRetention(time.Second, 3*sweepBatch, 1<<30, clock)
	for i := range sweepBatch + 10 {
		r.add(answered(fmt.Sprint(i), t0))
	}
	later := t0.Add(time.Second)
	if n := r.sweep(later); n != sweepBatch {
		t.Fatalf("first sweep dropped %d, want %d", n, sweepBatch)
	}
	if n := r.sweep(later); n != 10 || r.len() != 0 {
		t.Fatalf("second sweep dropped %d, %d left", n, r.len())
	}
}

// getAt looks id up with the clock at now.
func getAt(r *retention, clock *testClock, id string, now time.Time) (*taskRecord, bool) {
	clock.mu.Lock()
	clock.now = now
	clock.mu.Unlock()
	return r.get(id)
}
