package scheduler

import (
	"testing"
	"time"
)

// A load that evicts the only copy of a label still asked for costs that label's load
// too (the next task for it loads it again), so it must beat waiting by that much more
// than half a load. With every label a sole copy (seed-4: 4 labels on 2 workers of 2)
// a holder overrunning by a load and a half cost two misses, not one: the load and
// the reload of the label it evicted.
func TestLoadThatEvictsAnAskedForSoleCopyMustBeatWaitingByItsLoadToo(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 20 * time.Millisecond, RunTimePrior: 2 * time.Millisecond})
	b.worker("h", 1, 1, "a")
	b.worker("f", 1, 1, "c")
	runC := func() { // a c task on f, arriving now, done in its 2 ms
		c := b.task("c")
		one(t, b.submit(c))
		b.clock.advance(2 * time.Millisecond)
		b.complete(c, false)
	}
	runC()
	b.clock.advance(8 * time.Millisecond)
	runC() // c's tasks come every 10 ms or so
	stallHolderOfAWhileCIsAskedFor(t, b, runC)
}

// stallHolderOfAWhileCIsAskedFor stalls a's holder h while c's tasks keep coming on f,
// about every 10 ms until now, and checks that a task for a waits rather than evict c,
// asked for 12 ms ago, and loads on f once c has gone quiet.
func stallHolderOfAWhileCIsAskedFor(t *testing.T, b *bundle, runC func()) {
	t.Helper()
	stalled := b.task("a")
	one(t, b.submit(stalled))
	b.clock.advance(26 * time.Millisecond)
	runC()
	b.clock.advance(10 * time.Millisecond)
	// The holder of a is 36 ms past its 2 ms estimate: waiting is expected to take 38 ms,
	// a load on f 22 ms; 16 ms saved is more than half a load (10 ms), but not that and
	// c's load, which the next c task would pay.
	waiting := b.task("a")
	if as := b.submit(waiting); len(as) != 0 {
		t.Fatalf("got %+v: a loaded on f, evicting c, asked for 12 ms ago", as)
	}
	none(t, b.s.Rebalance().Assigned)
	// Once c's tasks have stopped coming (no task for two of its gaps), evicting it
	// costs nothing more, and the stuck holder's task loads.
	b.clock.advance(20 * time.Millisecond)
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != waiting || as[0].WorkerID != "f" || !as[0].Load || as[0].EvictLabel != "c" {
		t.Fatalf("got %+v, want %s loading a on f, evicting c, once c has gone quiet", as, waiting.ID)
	}
	check(t, b.s)
}

// A label whose first tasks come in one burst (at one instant in the simulator,
// microseconds apart through the dispatcher) has not shown a gap between its tasks yet:
// the burst must not leave its smoothed gap near zero, or its "asked for within two of
// its gaps" window closes at once for the dozens of arrivals the smoothing takes to
// recover, and the regret of evicting its only copy is not counted. The same arrivals as
// in TestLoadThatEvictsAnAskedForSoleCopyMustBeatWaitingByItsLoadToo, c's first task
// being a burst of two.
func TestBurstOfFirstTasksKeepsTheLabelAskedFor(t *testing.T) {
	t.Parallel()
	for _, apart := range []time.Duration{0, 20 * time.Microsecond} {
		t.Run(apart.String()+" apart", func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{LoadTimePrior: 20 * time.Millisecond, RunTimePrior: 2 * time.Millisecond})
			b.worker("h", 1, 1, "a")
			b.worker("f", 1, 1, "c")
			first, second := b.task("c"), b.task("c")
			one(t, b.submit(first))
			b.clock.advance(apart)
			none(t, b.submit(second)) // queued for f, which holds c
			b.clock.advance(2*time.Millisecond - apart)
			if a := one(t, b.complete(first, false)); a.Task != second || a.WorkerID != "f" {
				t.Fatalf("got %+v, want %s on f", a, second.ID)
			}
			b.clock.advance(2 * time.Millisecond)
			none(t, b.complete(second, false))
			b.clock.advance(6 * time.Millisecond)
			runC := func() {
				c := b.task("c")
				one(t, b.submit(c))
				b.clock.advance(2 * time.Millisecond)
				b.complete(c, false)
			}
			runC() // c's tasks come every 10 ms or so after the burst
			stallHolderOfAWhileCIsAskedFor(t, b, runC)
		})
	}
}
