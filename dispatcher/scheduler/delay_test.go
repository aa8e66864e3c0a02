package scheduler

import (
	"testing"
	"time"
)

// The figures of these tests are seed-4's at time-scale 0.05, the benchmark's main
// job: 20 ms loads, 2 ms runs, and on a host busy with other work, results that came
// back 50 to 200 ms after runs of 2 ms.

// delayBundle is two workers holding two labels each, every label a sole copy: a load
// anywhere evicts a label that the next task for it then misses.
func delayBundle(t *testing.T) *bundle {
	return delayBundleCapped(t, 0)
}

// delayBundleCapped is delayBundle with MaxDelaySlack set (0: the default).
func delayBundleCapped(t *testing.T, maxSlack time.Duration) *bundle {
	b := setup(t, Config{LoadTimePrior: 20 * time.Millisecond, RunTimePrior: 2 * time.Millisecond, MaxDelaySlack: maxSlack})
	b.worker("h", 2, 1, "a", "b")
	b.worker("f", 2, 1, "c", "d")
	return b
}

// runLate runs a task for label on its holder, whose result comes back `late` after
// the worker's 2 ms run: the delay outside the task that the scheduler learns.
func (b *bundle) runLate(label string, late time.Duration) {
	b.t.Helper()
	t := b.task(label)
	a := one(b.t, b.submit(t))
	b.clock.advance(2*time.Millisecond + late)
	if _, err := b.s.Complete(a.WorkerID, t, Observation{RunTime: 2 * time.Millisecond}); err != nil {
		b.t.Fatal(err)
	}
}

// A holder whose task overruns by no more than results have lately come back late is
// stalled with the host, not stuck: the task waiting for it is not loaded on the free
// worker, which would evict a label the next task misses. Past that slack the overrun
// counts as before (TestHolderPastItsRunEstimateIsNotAboutToFree): a stuck holder's
// task loads elsewhere.
func TestHostStallIsNotAStuckHolder(t *testing.T) {
	t.Parallel()
	b := delayBundle(t)
	b.runLate("a", 100*time.Millisecond)
	if got := b.s.DelaySlack(); got != 100*time.Millisecond {
		t.Fatalf("DelaySlack = %v after a result 100 ms late, want 100ms", got)
	}
	stalled := b.task("a")
	one(t, b.submit(stalled))
	b.clock.advance(60 * time.Millisecond) // 58 ms past its estimate: within the slack
	waiting := b.task("a")
	if as := b.submit(waiting); len(as) != 0 {
		t.Fatalf("the holder stalled 58 ms, less than the 100 ms seen; got %+v, want the task to wait", as)
	}
	none(t, b.s.Rebalance().Assigned)

	b.clock.advance(100 * time.Millisecond) // 158 ms: 58 ms past the slack, more than a load and a half
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != waiting || as[0].WorkerID != "f" || !as[0].Load {
		t.Fatalf("got %+v, want %s loading a on f: the holder is stuck", as, waiting.ID)
	}
	check(t, b.s)
}

// A task that has waited longer than a load and a run would have taken is overdue
// only past the delay slack: a load started when it was queued would have met the
// host's delays as well.
func TestHostStallMakesNoTaskOverdue(t *testing.T) {
	t.Parallel()
	b := delayBundle(t)
	b.runLate("a", 50*time.Millisecond)
	one(t, b.submit(b.task("a")))
	b.clock.advance(40 * time.Millisecond)
	waiting := b.task("a")
	none(t, b.submit(waiting))
	// The holder is 73 ms past its 2 ms estimate, 23 ms past the slack: expected to free
	// within a load and a half, so loading does not beat waiting. The task has waited
	// 35 ms, more than a load and a run (22 ms) but not more than that and the slack.
	b.clock.advance(35 * time.Millisecond)
	if as := b.s.Rebalance().Assigned; len(as) != 0 {
		t.Fatalf("got %+v after a 35 ms wait, within a load, a run and the 50 ms slack: want none", as)
	}
	check(t, b.s)
}

// The slack is the largest recent delay, halving every minute: on a host that went
// quiet, a holder stalled as long as it once was is taken to be stuck again.
func TestDelaySlackFades(t *testing.T) {
	t.Parallel()
	b := delayBundle(t)
	b.runLate("a", 100*time.Millisecond)
	b.runLate("a", 10*time.Millisecond) // a smaller delay leaves the largest in place
	if got := b.s.DelaySlack(); got < 99*time.Millisecond {
		t.Fatalf("DelaySlack = %v, want the 100 ms delay, barely faded", got)
	}
	b.clock.advance(5 * time.Minute)
	if got := b.s.DelaySlack(); got > 4*time.Millisecond {
		t.Fatalf("DelaySlack = %v five minutes on, want about 100 ms / 32", got)
	}
	one(t, b.submit(b.task("a")))
	b.clock.advance(60 * time.Millisecond)
	waiting := b.task("a")
	if as := b.submit(waiting); len(as) != 1 || as[0].WorkerID != "f" || !as[0].Load {
		t.Fatalf("got %+v, want %s loading a on f: the delay seen five minutes ago no longer covers a 58 ms overrun", as, waiting.ID)
	}
	check(t, b.s)
}

// Only a result that says what its attempt spent teaches a delay: a failed attempt's
// times may leave out a load cut short, and the load a task joined counts as its
// worker's time, not as delay.
func TestDelayIsTimeOutsideTheTask(t *testing.T) {
	t.Parallel()
	b := delayBundle(t)
	failed := b.task("a")
	one(t, b.submit(failed))
	b.clock.advance(time.Second)
	if _, err := b.s.Complete("h", failed, Observation{Failed: true}); err != nil {
		t.Fatal(err)
	}
	joined := b.task("a")
	one(t, b.submit(joined))
	b.clock.advance(502 * time.Millisecond) // waited 500 ms for another attempt's load
	if _, err := b.s.Complete("h", joined, Observation{LoadTime: 500 * time.Millisecond, RunTime: 2 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if got := b.s.DelaySlack(); got != 0 {
		t.Fatalf("DelaySlack = %v, want 0: no result came back later than its worker's times", got)
	}
	check(t, b.s)
}

// One very long delay (a 10 s network stall) counts as MaxDelaySlack, and the slack
// halves from there: uncapped, it would stay above a second for over three minutes.
func TestDelaySlackIsCapped(t *testing.T) {
	t.Parallel()
	b := delayBundle(t)
	b.runLate("a", 10*time.Second)
	if got := b.s.DelaySlack(); got != 2*time.Second {
		t.Fatalf("DelaySlack = %v after a result 10 s late, want the 2s default cap", got)
	}
	b.clock.advance(time.Minute)
	if got := b.s.DelaySlack(); got != time.Second {
		t.Fatalf("DelaySlack = %v a minute on, want half the cap", got)
	}

	c := setup(t, Config{MaxDelaySlack: 200 * time.Millisecond})
	c.worker("h", 2, 1, "a")
	c.runLate("a", 10*time.Second)
	if got := c.s.DelaySlack(); got != 200*time.Millisecond {
		t.Fatalf("DelaySlack = %v with MaxDelaySlack 200ms, want 200ms", got)
	}
	if _, err := New(Config{MaxDelaySlack: -time.Second}, &fakeClock{}); err == nil {
		t.Fatal("negative MaxDelaySlack accepted")
	}
}

// After one very long delay, a holder that is stuck is still found once its task is
// past its estimate by the capped slack and a load and a half: the task waiting for
// it loads on the free worker. Within the cap the holder still counts as stalled.
func TestStuckHolderIsFoundPastTheCappedSlack(t *testing.T) {
	t.Parallel()
	b := delayBundleCapped(t, time.Second)
	b.runLate("a", 10*time.Second)
	one(t, b.submit(b.task("a"))) // the holder's task, which never ends
	b.clock.advance(900 * time.Millisecond)
	waiting := b.task("a")
	if as := b.submit(waiting); len(as) != 0 {
		t.Fatalf("the holder is 898 ms past its estimate, within the 1 s cap; got %+v, want the task to wait", as)
	}
	// 1098 ms past its 2 ms estimate: past the slack (987 ms by now) by more than a
	// load and a half (30 ms). The task has waited 200 ms: not overdue.
	b.clock.advance(200 * time.Millisecond)
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != waiting || as[0].WorkerID != "f" || !as[0].Load || as[0].Reason != LoadBeatsWait {
		t.Fatalf("got %+v, want %s loading a on f (load beats wait): the holder is stuck, whatever the 10 s delay", as, waiting.ID)
	}
	check(t, b.s)
}

// After one very long delay, a task waiting behind a stuck holder is overdue once it
// has waited a load and a run past the capped slack. Loads of 200 ms leave a window
// where only that rule loads: the holder is expected to free within a load and a
// half, not within half a load.
func TestOverdueCountsPastTheCappedSlack(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 200 * time.Millisecond, RunTimePrior: 2 * time.Millisecond, MaxDelaySlack: time.Second})
	b.worker("h", 2, 1, "a", "b")
	b.worker("f", 2, 1, "c", "d")
	b.runLate("a", 10*time.Second)
	one(t, b.submit(b.task("a"))) // the holder's task, which never ends
	waiting := b.task("a")
	none(t, b.submit(waiting))
	// Slack 987 ms: 1150 ms is within a load and a run (202 ms) past it.
	b.clock.advance(1150 * time.Millisecond)
	none(t, b.s.Rebalance().Assigned)
	// At 1240 ms (slack 986 ms) the wait is past them; the holder, 252 ms past the
	// slack, is expected to free within a load and a half (300 ms) but not half a load.
	b.clock.advance(90 * time.Millisecond)
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != waiting || as[0].WorkerID != "f" || !as[0].Load || as[0].Reason != LoadOverdue {
		t.Fatalf("got %+v, want %s loading a on f (overdue)", as, waiting.ID)
	}
	check(t, b.s)
}
