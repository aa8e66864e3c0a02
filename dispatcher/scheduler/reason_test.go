package scheduler

import (
	"testing"
	"time"
)

// Every load names the rule that made it (Assignment.Reason), which the dispatcher
// logs: a run with more misses than expected is read by it.
func TestLoadReasons(t *testing.T) {
	t.Parallel()
	wantLoad := func(t *testing.T, as []Assignment, task *Task, worker string, why LoadReason) {
		t.Helper()
		if len(as) != 1 || as[0].Task != task || as[0].WorkerID != worker || !as[0].Load || as[0].Reason != why {
			t.Fatalf("got %+v, want %s loading on %s for %q", as, task.ID, worker, why)
		}
	}
	t.Run("no holder", func(t *testing.T) {
		b := setup(t, Config{})
		b.worker("w", 1, 1)
		task := b.task("a")
		wantLoad(t, b.submit(task), task, "w", LoadNoHolder)
	})
	t.Run("load beats wait", func(t *testing.T) {
		b := delayBundle(t) // 20 ms loads, 2 ms runs
		one(t, b.submit(b.task("a")))
		b.clock.advance(60 * time.Millisecond) // the holder is stuck: 58 ms over
		task := b.task("a")
		wantLoad(t, b.submit(task), task, "f", LoadBeatsWait)
	})
	t.Run("overdue", func(t *testing.T) {
		b := delayBundle(t)
		one(t, b.submit(b.task("a")))
		task := b.task("a")
		none(t, b.submit(task))
		// 25 ms: longer than a load and a run, and the holder, 23 ms over, is not
		// expected within half a load; but waiting still beats a load and a half.
		b.clock.advance(25 * time.Millisecond)
		wantLoad(t, b.s.Rebalance().Assigned, task, "f", LoadOverdue)
	})
	t.Run("passed over", func(t *testing.T) {
		b := setup(t, Config{MaxPassOver: time.Millisecond, PassOverLoads: 0.001})
		b.worker("w", 1, 1, "a")
		running := b.task("a")
		one(t, b.submit(running))
		aged := b.task("b")
		none(t, b.submit(aged))
		none(t, b.submit(b.task("a"))) // the held label's task it would otherwise take
		b.clock.advance(10 * time.Millisecond)
		wantLoad(t, b.complete(running, false), aged, "w", LoadPassedOver)
	})
	t.Run("random", func(t *testing.T) {
		b := setup(t, Config{Policy: PolicyRandom})
		b.worker("w", 1, 1)
		task := b.task("a")
		wantLoad(t, b.submit(task), task, "w", LoadRandom)
	})
}
