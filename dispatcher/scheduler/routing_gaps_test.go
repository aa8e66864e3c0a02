package scheduler

import (
	"fmt"
	"testing"
	"time"
)

// A task whose label only one free worker can load is given to it: loadTarget samples
// 8 free workers and offerFree 32, and they used to look from the same end every time.
func TestTheOneWorkerThatCanLoadALabelIsFound(t *testing.T) {
	b := setup(t, Config{FleetSettle: time.Nanosecond})
	if _, err := b.s.AddWorker(WorkerSpec{ID: "gpu", MaxLabels: 1, Slots: 1, Loadable: []string{"X"}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		if _, err := b.s.AddWorker(WorkerSpec{ID: fmt.Sprintf("cpu%d", i), MaxLabels: 1, Slots: 1, Loadable: []string{"A"}}); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.advance(time.Second)
	x := b.task("X")
	out, _ := b.s.Submit(x)
	if len(out.Failed) > 0 {
		t.Fatalf("failed: %+v", out.Failed)
	}
	for i := 0; i < 100; i++ {
		b.clock.advance(20 * time.Millisecond)
		b.s.Rebalance()
	}
	if x.Queued() {
		t.Fatalf("task X queued for 2s while worker gpu, the one that can load X, idles")
	}
}

// A freed worker looking for a label to load counts label backlogs, not tasks: 8 tasks
// of one label it cannot take at the head used to hide a task it could take.
func TestOneLabelsBacklogDoesNotHideTheTasksBehindIt(t *testing.T) {
	b := setup(t, Config{FleetSettle: time.Nanosecond})
	if _, err := b.s.AddWorker(WorkerSpec{ID: "gpu", MaxLabels: 1, Slots: 1, Labels: []string{"X"}, Loadable: []string{"X"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.s.AddWorker(WorkerSpec{ID: "cpu", MaxLabels: 1, Slots: 1, Labels: []string{"Z"}, Loadable: []string{"Y", "Z"}}); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(time.Second)
	xr := b.task("X")
	one(t, b.submit(xr))
	zr := b.task("Z")
	one(t, b.submit(zr))
	for i := 0; i < 8; i++ {
		none(t, b.submit(b.task("X"))) // wait for gpu; cpu cannot load X
	}
	y := b.task("Y")
	none(t, b.submit(y))  // no free worker now
	b.complete(zr, false) // cpu frees
	for i := 0; i < 50; i++ {
		b.clock.advance(20 * time.Millisecond)
		b.s.Rebalance()
	}
	if y.Queued() {
		t.Fatalf("task Y queued for 1s while cpu, which can load Y, idles (%d tasks queued ahead)", b.s.QueuedTasks()-1)
	}
}

// A task whose deadline passed is not started (with a load and an eviction) when a
// worker frees before the next Expire: it fails.
func TestTaskPastItsDeadlineIsNotStarted(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w", 1, 1, "A")
	b.clock.advance(10 * time.Second)
	r := b.task("A")
	one(t, b.submit(r))
	late := b.task("B")
	late.Deadline = b.clock.now.Add(100 * time.Millisecond)
	none(t, b.submit(late))
	b.clock.advance(110 * time.Millisecond)
	as := b.complete(r, false)
	if len(as) == 1 && as[0].Task == late {
		t.Fatalf("task past its deadline assigned to %s, load %v, evicting %q", as[0].WorkerID, as[0].Load, as[0].EvictLabel)
	}
}

// The same without backend lists: 40 free multi-slot workers whose only label is in
// use cannot load X; the idle worker that can must be visited in turn.
func TestEveryFreeWorkerIsVisitedInTurn(t *testing.T) {
	b := setup(t, Config{})
	b.worker("idle", 1, 1, "B")
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("m%d", i)
		b.worker(id, 1, 2, "A")
		if a := one(t, b.submit(b.task("A"))); a.WorkerID != id {
			t.Fatalf("A went to %s", a.WorkerID)
		}
	}
	b.clock.advance(10 * time.Second)
	x := b.task("X")
	b.submit(x)
	for i := 0; i < 500; i++ {
		b.clock.advance(20 * time.Millisecond)
		b.s.Rebalance()
	}
	if x.Queued() {
		v, _ := b.s.Worker("idle")
		t.Fatalf("task X queued for 10s while worker idle (labels %v, running %d) could load it", v.Labels, v.Running)
	}
}

// Rule 4 holds beyond the head of the global queue: a head the freed worker cannot take
// (its backend cannot load the label) must not shield the task behind it from the
// pass-over bound while the worker serves its own backlog.
func TestPassOverBoundHoldsBehindAHeadTheWorkerCannotTake(t *testing.T) {
	b := setup(t, Config{MaxPassOver: time.Second, PassOverLoads: 1})
	for _, spec := range []WorkerSpec{
		{ID: "w", MaxLabels: 1, Slots: 1, Labels: []string{"A"}, Loadable: []string{"A", "Y"}},
		{ID: "g", MaxLabels: 1, Slots: 1, Labels: []string{"X"}, Loadable: []string{"X"}},
	} {
		if _, err := b.s.AddWorker(spec); err != nil {
			t.Fatal(err)
		}
	}
	gx := b.task("X")
	one(t, b.submit(gx)) // g busy with a long X task
	running := b.task("A")
	one(t, b.submit(running))
	h := b.task("X")
	none(t, b.submit(h))
	starving := b.task("Y")
	none(t, b.submit(starving))
	for i := 0; i < 50; i++ { // 10 s of A backlog on w
		next := b.task("A")
		none(t, b.submit(next))
		b.clock.advance(200 * time.Millisecond)
		b.complete(running, false)
		if starving.Running() {
			return
		}
		running = next
	}
	t.Fatalf("task Y passed over for %v (bound 1s) while w served its A backlog", b.clock.now.Sub(starving.Enqueued))
}

// A task that waited long only because of the queue ahead of it is not loaded on a freed
// worker (400ms, evicting its label) when its holder frees in 5ms.
func TestLongWaitDoesNotLoadWhenTheHolderFreesInMs(t *testing.T) {
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
	b.worker("h", 1, 1, "A")
	b.worker("f", 1, 1, "B")
	b.clock.advance(10 * time.Second)
	run := b.task("A")
	one(t, b.submit(run))
	fb := b.task("B")
	one(t, b.submit(fb)) // f busy for now
	var last *Task
	for i := 0; i < 10; i++ { // at most 9 ahead: expected wait <= 550ms < 650ms: wait
		last = b.task("A")
		none(t, b.submit(last))
	}
	for i := 0; i < 9; i++ { // h runs through the backlog at 50ms a task
		b.clock.advance(50 * time.Millisecond)
		run = one(t, b.complete(run, false)).Task
	}
	// 450ms: h started the 9th queued task; the 10th is alone in the queue.
	b.clock.advance(45 * time.Millisecond) // h frees in ~5ms
	out, _ := b.s.Complete("f", fb, Observation{RunTime: 50 * time.Millisecond})
	for _, a := range out.Assigned {
		if a.Task == last && a.Load {
			t.Fatalf("f loads A (evicting %q) for %s, queued %v, though h frees in ~5ms: done at +450ms instead of +55ms",
				a.EvictLabel, a.Task.ID, b.clock.now.Sub(last.Enqueued))
		}
	}
}

// A worker whose copy of a label is still loading is not an idle holder like one that
// has it loaded: a task goes where it finishes soonest, here by waiting ~5ms for the
// loaded holder rather than the ~1.95s left of the load on the other worker's free slots.
func TestTaskWaitsForLoadedHolderRatherThanAPendingLoad(t *testing.T) {
	b := setup(t, Config{LoadTimePrior: 2 * time.Second, RunTimePrior: 50 * time.Millisecond})
	b.worker("m", 2, 3) // three slots, nothing loaded
	if a := one(t, b.submit(b.task("A"))); a.WorkerID != "m" || !a.Load {
		t.Fatalf("got %+v", a)
	}
	b.worker("h", 1, 1, "A") // A loaded, idle
	t2 := b.task("A")
	if a := one(t, b.submit(t2)); a.WorkerID != "h" {
		t.Fatalf("t2 went to %s", a.WorkerID)
	}
	b.clock.advance(45 * time.Millisecond) // h frees in ~5ms; m's load needs ~1.95s more
	t3 := b.task("A")
	if as := b.submit(t3); len(as) == 1 && as[0].WorkerID == "m" {
		t.Fatalf("t3 sent to m to wait ~1.95s for its load, though h frees in ~5ms")
	}
	b.s.Rebalance() // m, free, reconsiders the queue: the same answer
	if !t3.Queued() {
		t.Fatalf("t3 left the queue for %s before h freed", t3.WorkerID())
	}
	b.clock.advance(5 * time.Millisecond)
	if a := one(t, b.complete(t2, false)); a.Task != t3 || a.WorkerID != "h" {
		t.Fatalf("h freed and got %+v, want t3", a)
	}
}

// A copy that finishes loading takes the tasks that waited for another holder rather
// than for it: they no longer wait for the next tick or the copy's first result.
func TestCopyThatFinishesLoadingTakesQueuedTasks(t *testing.T) {
	b := setup(t, Config{LoadTimePrior: 2 * time.Second, RunTimePrior: 50 * time.Millisecond})
	b.worker("m", 2, 3)
	one(t, b.submit(b.task("A"))) // m loads A
	b.worker("h", 1, 1, "A")
	one(t, b.submit(b.task("A"))) // h busy
	b.clock.advance(45 * time.Millisecond)
	t3 := b.task("A")
	none(t, b.submit(t3)) // h frees sooner than m's load ends
	out := b.s.LabelLoaded("m", "A")
	if len(out.Assigned) != 1 || out.Assigned[0].Task != t3 || out.Assigned[0].WorkerID != "m" {
		t.Fatalf("m loaded A and assigned %+v, want t3 on m", out.Assigned)
	}
}
