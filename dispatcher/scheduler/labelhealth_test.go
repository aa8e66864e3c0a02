package scheduler

import (
	"fmt"
	"testing"
	"time"
)

// loadFailed reports, as an agent does, the failure of a load t started: the
// LOAD_FAILED event, then t's result. It returns copies of both outcomes' slices.
func (b *bundle) loadFailed(t *Task, reason string) ([]Assignment, []Failure) {
	b.t.Helper()
	return b.loadFailedAs(t, reason, true)
}

// loadFailedAs reports a load failure; started is false for an attempt that joined a
// load another attempt started, whose result comes without the event.
func (b *bundle) loadFailedAs(t *Task, reason string, started bool) ([]Assignment, []Failure) {
	b.t.Helper()
	var as []Assignment
	var fs []Failure
	if started {
		ev := b.s.LabelLoadFailed(t.WorkerID(), t.Label, reason)
		as, fs = append(as, ev.Assigned...), append(fs, ev.Failed...)
	}
	out, err := b.s.LoadFailed(t.WorkerID(), t, reason)
	if err != nil {
		b.t.Fatal(err)
	}
	return append(as, out.Assigned...), append(fs, out.Failed...)
}

// A load failure sends the task to another worker, never back to the one that failed.
func TestLoadFailureExcludesWorker(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 10})
	b.worker("w1", 2, 1)
	b.worker("w2", 2, 1)
	tk := b.task("L")
	first := b.submit(tk)
	if len(first) != 1 {
		t.Fatalf("first assignment %v", first)
	}
	failedOn := first[0].WorkerID
	again, failed := b.loadFailed(tk, "out of memory")
	if len(failed) != 0 || len(again) != 1 || again[0].WorkerID == failedOn || tk.Attempt != 2 {
		t.Fatalf("after a load failure on %s: assigned %v failed %v attempt %d", failedOn, again, failed, tk.Attempt)
	}
	// Both workers failed it: it waits (never back to them) rather than bouncing.
	if again, failed = b.loadFailed(tk, "out of memory"); len(again) != 0 || len(failed) != 0 || !tk.Queued() {
		t.Fatalf("after failures on both: assigned %v failed %v", again, failed)
	}
	// A new worker takes it; failing there uses the last attempt: FailLoad with the reason.
	if as := b.worker("w3", 2, 1); len(as) != 1 || as[0].Task != tk {
		t.Fatalf("new worker got %v", as)
	}
	_, failed = b.loadFailed(tk, "out of memory")
	if len(failed) != 1 || failed[0].Reason != FailLoad || failed[0].LoadError != "out of memory" {
		t.Fatalf("third failure: %v", failed)
	}
	check(t, b.s)
}

// Repeated failures mark the label failing: its queued and new tasks fail at once with
// the reason; after the cool-down one attempt probes; a working load clears it.
func TestLabelFailingCooldownAndProbe(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 2, LabelFailureWindow: time.Minute, LabelFailureCooldown: 30 * time.Second})
	b.worker("w1", 2, 1)
	b.worker("w2", 2, 1)
	b.worker("w3", 1, 1, "other")
	b.submit(b.task("other")) // keeps w3 busy
	t1 := b.task("L")
	b.submit(t1)
	queued := b.task("L")
	b.submit(queued) // waits for the load t1 started
	if !t1.Running() || !queued.Queued() {
		t.Fatal("want t1 running and the second task waiting for its load")
	}
	// The LOAD_FAILED event comes before t1's result and may hand w2 to the queued task
	// first; t1 then waits at the head of the queue.
	if _, failed := b.loadFailed(t1, "bad weights"); len(failed) != 0 || !(t1.Running() || t1.Queued()) {
		t.Fatalf("one failure is not a pattern: %v", failed)
	}
	b.clock.advance(time.Second)
	if queued.Running() { // it may have started on the worker t1 left; keep it waiting
		b.complete(queued, false)
		queued = b.task("L")
		b.submit(queued)
	}
	_, failed := b.loadFailed(t1, "bad weights")
	reasons := map[*Task]FailReason{}
	for _, f := range failed {
		reasons[f.Task] = f.Reason
		if f.LoadError != "bad weights" {
			t.Fatalf("failure without the load error: %+v", f)
		}
	}
	if reasons[t1] != FailLabelFailing {
		t.Fatalf("second failure within the window: %v", failed)
	}
	if queued.Queued() || (!queued.Running() && reasons[queued] != FailLabelFailing) {
		t.Fatalf("task queued for the label neither running nor failed fast: %v", failed)
	}
	check(t, b.s)

	t4 := b.task("L")
	out, _ := b.s.Submit(t4)
	if len(out.Failed) != 1 || out.Failed[0].Reason != FailLabelFailing || len(out.Assigned) != 0 {
		t.Fatalf("submit while failing: %+v", out)
	}
	if until, msg, ok := b.s.LabelFailing("L"); !ok || msg != "bad weights" || !until.Equal(b.clock.now.Add(30*time.Second)) {
		t.Fatalf("LabelFailing: %v %q %v", until, msg, ok)
	}

	b.clock.advance(30 * time.Second) // cool-down over: a probe runs
	probe := b.task("L")
	if as := b.submit(probe); len(as) != 1 {
		t.Fatalf("probe not assigned: %v", as)
	}
	if _, failed := b.loadFailed(probe, "still bad"); len(failed) != 1 || failed[0].Reason != FailLabelFailing {
		t.Fatalf("a failed probe marks the label failing again at once: %v", failed)
	}

	b.clock.advance(30 * time.Second)
	probe = b.task("L")
	b.submit(probe)
	b.s.LabelLoaded(probe.WorkerID(), "L") // the probe's load worked
	b.complete(probe, true)
	tk := b.task("L")
	b.submit(tk)
	if _, failed := b.loadFailed(tk, "flaky"); len(failed) != 0 {
		t.Fatalf("after a working load one failure is not enough: %v", failed)
	}
	check(t, b.s)
}

// Tasks that waited on one worker for the same load all report its failure; it counts
// once toward the threshold, and every one of them goes elsewhere.
func TestSharedLoadFailureCountsOnce(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 2})
	b.worker("w1", 2, 4)
	b.worker("w2", 2, 4)
	var shared []*Task
	for range 3 {
		tk := b.task("L")
		b.submit(tk)
		shared = append(shared, tk)
	}
	on := shared[0].WorkerID()
	for _, tk := range shared {
		if tk.WorkerID() != on || on == "" {
			t.Fatalf("want the three tasks sharing one load on one worker, got %q %q %q", shared[0].WorkerID(), shared[1].WorkerID(), shared[2].WorkerID())
		}
	}
	// Results come back in any order: the two that joined first, then the one that
	// started the load.
	for i, tk := range []*Task{shared[1], shared[2], shared[0]} {
		if _, failed := b.loadFailedAs(tk, "out of memory", i == 2); len(failed) != 0 {
			t.Fatalf("one failed load failed tasks: %v", failed)
		}
	}
	if _, _, failing := b.s.LabelFailing("L"); failing {
		t.Fatal("one failed load marked the label failing")
	}
	for _, tk := range shared {
		if tk.WorkerID() == on || tk.Attempt != 2 {
			t.Fatalf("task %s after the failed load: on %q attempt %d, want another worker's second attempt", tk.ID, tk.WorkerID(), tk.Attempt)
		}
	}
	// A second failed load within the window reaches the threshold; the tasks that
	// joined it then fail with the label rather than go round again.
	starter := shared[0]
	if _, failed := b.loadFailed(starter, "out of memory"); len(failed) == 0 || failed[0].Reason != FailLabelFailing {
		t.Fatalf("second failed load: %v", failed)
	}
	for _, tk := range shared {
		if tk == starter || !tk.Running() {
			continue
		}
		if _, failed := b.loadFailedAs(tk, "out of memory", false); len(failed) != 1 || failed[0].Reason != FailLabelFailing {
			t.Fatalf("joiner of a load that marked the label failing: %v", failed)
		}
	}
	check(t, b.s)
}

// A load that fails after the task that started it ended (its deadline passed during
// a slow load) still counts: the failure is counted from the LOAD_FAILED event, not
// from the results of the tasks that waited for the load.
func TestLoadFailureCountedWhenItsStarterEndedFirst(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 1})
	b.worker("w1", 2, 2)
	starter, joiner := b.task("L"), b.task("L")
	b.submit(starter)
	b.submit(joiner)
	if starter.WorkerID() != "w1" || joiner.WorkerID() != "w1" {
		t.Fatalf("want both on w1: %q %q", starter.WorkerID(), joiner.WorkerID())
	}
	if _, err := b.s.Complete("w1", starter, Observation{Loaded: true, Failed: true}); err != nil {
		t.Fatal(err)
	}
	b.s.LabelLoadFailed("w1", "L", "out of memory")
	if _, _, failing := b.s.LabelFailing("L"); !failing {
		t.Fatal("the failed load was not counted")
	}
	if _, failed := b.loadFailedAs(joiner, "out of memory", false); len(failed) != 1 || failed[0].Reason != FailLabelFailing {
		t.Fatalf("the task that waited for the failed load: %v", failed)
	}
	check(t, b.s)
}

// A LOADED event for a label the scheduler does not place on that worker (the agent
// confirming a label it kept) proves nothing about loading it: a failing label stays
// failing.
func TestConfirmedLabelDoesNotClearFailing(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 1})
	b.worker("w1", 2, 1)
	b.worker("w2", 2, 1)
	tk := b.task("L")
	b.submit(tk)
	b.loadFailed(tk, "out of memory")
	if _, _, failing := b.s.LabelFailing("L"); !failing {
		t.Fatal("want L failing")
	}
	other := "w1"
	if tk.WorkerID() == "w1" || tk.WorkerID() == "" {
		other = "w2"
	}
	b.s.LabelLoaded(other, "L") // not in the scheduler's view of that worker
	if _, _, failing := b.s.LabelFailing("L"); !failing {
		t.Fatal("a confirmation of a kept label cleared the failing mark")
	}
	check(t, b.s)
}

// Failure records of labels that stopped failing are dropped.
func TestLabelFailuresPruned(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 5})
	b.worker("w1", 2, 1)
	tk := b.task("L")
	b.submit(tk)
	b.loadFailed(tk, "x")
	if len(b.s.failing) != 1 {
		t.Fatal("failure not recorded")
	}
	b.clock.advance(2 * time.Minute)
	b.s.Rebalance()
	if len(b.s.failing) != 0 {
		t.Fatal("old failure record kept")
	}
}

// A task whose label failed to load on every connected worker, with attempts left,
// can go nowhere: it fails at once with the load error (502), or, while the fleet is
// still changing, once it has settled, unless a worker that may take it came. It
// waited for its deadline and ended in a 504.
func TestTaskExcludedFromEveryWorkerFailsWithTheLoadError(t *testing.T) {
	t.Parallel()
	fail := func(b *bundle, tk *Task, reason string) []Failure {
		b.t.Helper()
		_, fs := b.loadFailed(tk, reason)
		return fs
	}
	t.Run("settled fleet", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{LabelFailureThreshold: 10})
		b.worker("w1", 2, 1)
		b.worker("w2", 2, 1)
		b.clock.advance(time.Minute)
		tk := b.task("L")
		one(t, b.submit(tk))
		if fs := fail(b, tk, "weights corrupt on first"); len(fs) != 0 || !tk.Running() {
			t.Fatalf("first failure: %+v, running %v; want the task on the other worker", fs, tk.Running())
		}
		fs := fail(b, tk, "weights corrupt on second")
		if len(fs) != 1 || fs[0].Task != tk || fs[0].Reason != FailLoad || fs[0].LoadError != "weights corrupt on second" {
			t.Fatalf("failed on both workers (attempt 2 of 3): %+v, want FailLoad with the last error", fs)
		}
	})
	t.Run("changing fleet", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{LabelFailureThreshold: 10})
		b.worker("w1", 2, 1)
		b.worker("w2", 2, 1)
		tk := b.task("L")
		one(t, b.submit(tk))
		fail(b, tk, "first")
		if fs := fail(b, tk, "second"); len(fs) != 0 || !tk.Queued() {
			t.Fatalf("within FleetSettle of a worker joining: %+v, want the task to wait", fs)
		}
		b.clock.advance(31 * time.Second)
		out := b.s.Rebalance()
		if len(out.Failed) != 1 || out.Failed[0].Task != tk || out.Failed[0].Reason != FailLoad || out.Failed[0].LoadError != "second" {
			t.Fatalf("after FleetSettle: %+v, want FailLoad with the last error", out.Failed)
		}
	})
	t.Run("a worker comes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{LabelFailureThreshold: 10})
		b.worker("w1", 2, 1)
		tk := b.task("L")
		one(t, b.submit(tk))
		fail(b, tk, "first")
		if a := one(t, b.worker("w2", 2, 1)); a.Task != tk {
			t.Fatalf("w2 took %s", a.Task.ID)
		}
		b.clock.advance(31 * time.Second)
		if out := b.s.Rebalance(); len(out.Failed) != 0 || !tk.Running() {
			t.Fatalf("running on a new worker: %+v, want it left alone", out.Failed)
		}
	})
}

// A task whose deadline passed during a load that then failed, with nowhere else to go
// (every connected worker tried), fails as late (504), not FailLoad (502): a passed
// deadline wins whatever else happened, as in failSpent.
func TestDeadlinePassedDuringAFailedLoadFailsAsLate(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 10, FleetSettle: time.Second})
	b.worker("w1", 1, 1)
	b.clock.advance(2 * time.Second) // fleet settled
	tk := b.task("a")
	tk.Deadline = b.clock.now.Add(time.Second)
	one(t, b.submit(tk))
	b.clock.advance(5 * time.Second) // a slow load: the deadline passes during it
	_, failed := b.loadFailed(tk, "out of memory")
	if len(failed) != 1 || failed[0].Reason != FailDeadline {
		t.Fatalf("deadline passed during the failed load: got %+v, want one FailDeadline", failed)
	}
}

// The same on the last attempt (MaxAttempts).
func TestDeadlinePassedDuringAFailedLastAttemptFailsAsLate(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 10, MaxAttempts: 1})
	b.worker("w1", 1, 1)
	b.worker("w2", 1, 1)
	tk := b.task("a")
	tk.Deadline = b.clock.now.Add(time.Second)
	one(t, b.submit(tk))
	b.clock.advance(5 * time.Second)
	_, failed := b.loadFailed(tk, "out of memory")
	if len(failed) != 1 || failed[0].Reason != FailDeadline {
		t.Fatalf("deadline passed during the failed last attempt: got %+v, want one FailDeadline", failed)
	}
}

// excludedQueued forgets finished tasks at every Rebalance, not only at the sweep,
// which waits for the fleet to settle: under churn (autoscaling, rolling restarts)
// every task ever requeued after a failed load was kept, with its owner's record.
func TestExcludedQueuedDoesNotGrowUnderFleetChurn(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 1000, FleetSettle: 30 * time.Second})
	b.worker("w1", 1, 1)
	b.worker("w2", 1, 1)
	for i := 0; i < 200; i++ {
		tk := b.task(fmt.Sprintf("L%d", i))
		one(t, b.submit(tk))
		again, failed := b.loadFailedAs(tk, "out of memory", false) // fails on one worker...
		if len(failed) != 0 || len(again) != 1 {
			t.Fatalf("step %d: assigned %v failed %v", i, again, failed)
		}
		b.complete(tk, true) // ...and completes on the other
		// Every 10 s a worker joins or leaves somewhere in the fleet.
		b.clock.advance(10 * time.Second)
		id := fmt.Sprintf("x%d", i)
		b.worker(id, 1, 1)
		b.s.Rebalance()
		if i > 0 {
			b.s.RemoveWorker(fmt.Sprintf("x%d", i-1))
		}
	}
	if n := len(b.s.excludedQueued); n > 10 {
		live := 0
		for _, e := range b.s.excludedQueued {
			if e.t.state == stateQueued {
				live++
			}
		}
		t.Fatalf("excludedQueued holds %d entries (%d of them queued) after 200 tasks that all completed", n, live)
	}
}

// A LOAD_FAILED from a worker that was never asked to load the label, and does not
// hold it, is not the label's failure: one buggy or hostile agent's events had marked a
// label failing for the whole fleet while another worker served it. The worker asked
// to load it still counts, even once the attempt that asked has ended; and a second
// event for that one load does not count again.
func TestLoadFailureCountsOnlyForALoadTheWorkerWasAsked(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 2, LabelFailureCooldown: time.Hour})
	b.worker("good", 1, 1, "m")
	b.worker("bad", 1, 1)
	for range 5 {
		b.s.LabelLoadFailed("bad", "m", "no such model")
	}
	if _, _, failing := b.s.LabelFailing("m"); failing {
		t.Fatal("worker bad, never asked to load m, marked it failing")
	}
	b.worker("w3", 1, 1)
	held, loads := b.task("m"), b.task("x")
	b.submit(held) // on good, its holder
	b.submit(loads)
	if loads.WorkerID() == "" {
		t.Fatal("x was not placed")
	}
	w := loads.WorkerID()
	if _, err := b.s.Complete(w, loads, Observation{Loaded: true, Failed: true}); err != nil {
		t.Fatal(err)
	}
	b.s.LabelLoadFailed(w, "x", "out of memory") // the attempt ended first: still counted
	b.s.LabelLoadFailed(w, "x", "out of memory") // the same load told twice: not again
	if _, _, failing := b.s.LabelFailing("x"); failing {
		t.Fatal("one failed load counted twice")
	}
	again := b.task("x")
	b.submit(again)
	if again.WorkerID() == "" {
		t.Fatal("x was not placed again")
	}
	b.loadFailed(again, "out of memory")
	if _, _, failing := b.s.LabelFailing("x"); !failing {
		t.Fatal("two failed loads asked of workers did not reach the threshold of 2")
	}
	check(t, b.s)
}

// An EVICTED event is an unload when the worker was sent a task evicting the label (the
// copy left the view then), or holds it loaded; not for a load it gave up before making
// it (the copy still pending), nor for a label it never had.
func TestUnloadedTellsEvictionsFromStrayEvents(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w1", 1, 1, "a")
	if !b.s.Unloaded("w1", "a") || b.s.Unloaded("w1", "never") || b.s.Unloaded("nobody", "a") {
		t.Fatal("a held label is unloaded; a label never held or an unknown worker is not")
	}
	tk := b.task("b")
	b.submit(tk) // evicts a for b's load
	if got := b.s.Unloaded("w1", "b"); got {
		t.Error("a load not yet made (pending) counted as unloaded")
	}
	if !b.s.Unloaded("w1", "a") {
		t.Error("the eviction the worker was sent is not counted")
	}
	if b.s.Unloaded("w1", "a") {
		t.Error("one eviction counted twice")
	}
	check(t, b.s)
}

// A load the worker refused, or whose attempt ended before it began, was never made:
// its entry goes, so a later stray LOAD_FAILED for the label does not count, and so
// does the eviction it named once the worker confirms the label kept. Before, both
// stayed for the connection's life, one per label a producer named.
func TestRefusedLoadLeavesNothingAsked(t *testing.T) {
	b := setup(t, Config{LabelFailureThreshold: 1, MaxAttempts: 100})
	b.worker("w", 1, 1, "kept")
	for i := range 20 {
		tk := b.task(fmt.Sprintf("l%d", i))
		b.submit(tk)
		if tk.WorkerID() != "w" {
			t.Fatalf("task %s not on w", tk.ID)
		}
		if _, err := b.s.Requeue("w", tk); err != nil { // the agent refused it
			t.Fatal(err)
		}
		if !b.s.Cancel(tk) {
			t.Fatalf("task %s not queued after the refusal", tk.ID)
		}
		b.s.LabelLoaded("w", "kept") // confirmKept: the label to evict stayed
	}
	if w := b.s.workers["w"]; len(w.loadsAsked) != 0 || len(w.evictsAsked) != 0 {
		t.Fatalf("loadsAsked %v, evictsAsked %v after refused loads only", w.loadsAsked, w.evictsAsked)
	}
	b.worker("good", 1, 1, "l0")
	b.s.LabelLoadFailed("w", "l0", "stray")
	if _, _, failing := b.s.LabelFailing("l0"); failing {
		t.Fatal("a LOAD_FAILED for a load w refused marked l0 failing for the fleet")
	}
	check(t, b.s)
}
