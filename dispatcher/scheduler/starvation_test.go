package scheduler

import (
	"fmt"
	"testing"
	"time"
)

// Rule 4's bound on a worker with more slots than labels: once every label it holds
// is in use it cannot take a task for another label (a label in use is never
// evicted), and while its labels' tasks keep coming they stay in use. A task past its
// bound must not be overtaken there for ever: the worker takes no new task of one of
// its labels until that label can be evicted for the aged task.
func TestAgedTaskNotOvertakenOnMultiSlotWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{}) // bound: max(2 s, 100 × 400 ms) = 40 s
	b.worker("w1", 1, 2, "a")
	first, second := b.task("a"), b.task("a")
	one(t, b.submit(first))
	one(t, b.submit(second))
	aged := b.task("b")
	none(t, b.submit(aged)) // w1's only label is in use
	queuedA := b.task("a")
	none(t, b.submit(queuedA)) // no free slot
	b.clock.advance(time.Minute)

	// The freed slot goes neither to the older "a" task in the queue nor to a new one.
	none(t, b.complete(first, false))
	none(t, b.submit(b.task("a")))
	// With its last "a" task done, w1 evicts a and loads b for the aged task.
	a := one(t, b.complete(second, false))
	if a.Task != aged || !a.Load || a.EvictLabel != "a" {
		t.Fatalf("took %s (load %v, evicting %q), want the aged %s loading b evicting a",
			a.Task.ID, a.Load, a.EvictLabel, aged.ID)
	}
	check(t, b.s)
}

// One worker frees a label for an aged task, not every worker that could load it: the
// others go on serving their labels.
func TestOneWorkerFreesALabelForAnAgedTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 2, "a")
	b.worker("w2", 1, 2, "a")
	on := map[string][]*Task{}
	for i := 0; i < 4; i++ {
		r := b.task("a")
		one(t, b.submit(r))
		on[r.WorkerID()] = append(on[r.WorkerID()], r)
	}
	aged := b.task("b")
	none(t, b.submit(aged))
	b.clock.advance(time.Minute)
	none(t, b.complete(on["w1"][0], false)) // w1 frees its label for the aged task
	next := b.task("a")
	none(t, b.submit(next)) // not to w1's free slot
	if a := one(t, b.complete(on["w2"][0], false)); a.Task != next {
		t.Fatalf("w2 took %s, want %s: it need not free its label too", a.Task.ID, next.ID)
	}
	if a := one(t, b.complete(on["w1"][1], false)); a.Task != aged || a.EvictLabel != "a" {
		t.Fatalf("w1 took %s evicting %q, want the aged %s evicting a", a.Task.ID, a.EvictLabel, aged.ID)
	}
	check(t, b.s)
}

// A worker freeing a label for an aged task frees one, the soonest idle, and keeps
// serving the others: they are in use anyway, so they do not delay the aged task.
func TestWorkerFreesOneLabelForAnAgedTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 2, 5, "a", "b")
	var as []*Task
	for i := 0; i < 3; i++ {
		as = append(as, b.task("a"))
		one(t, b.submit(as[i]))
	}
	onB := b.task("b")
	one(t, b.submit(onB))
	aged := b.task("c")
	none(t, b.submit(aged)) // a and b in use: no label to evict
	b.clock.advance(time.Minute)
	none(t, b.complete(as[0], false)) // b, with one task running, is the one to free
	one(t, b.submit(b.task("a")))     // a still serves
	none(t, b.submit(b.task("b")))    // b takes no more
	a := one(t, b.complete(onB, false))
	if a.Task != aged || a.EvictLabel != "b" {
		t.Fatalf("took %s evicting %q, want the aged %s evicting b", a.Task.ID, a.EvictLabel, aged.ID)
	}
	check(t, b.s)
}

// Random mode is one FIFO: a new task does not overtake the head on a multi-slot
// worker that the head waits for (its labels in use), or the head waits for as long as
// the worker's labels keep getting traffic.
func TestRandomModeNewTaskDoesNotOvertakeHead(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Policy: PolicyRandom, Seed: 7})
	b.worker("w1", 1, 2, "a")
	first, second := b.task("a"), b.task("a")
	one(t, b.submit(first))
	one(t, b.submit(second))
	head := b.task("b")
	none(t, b.submit(head))
	none(t, b.complete(first, false)) // "a" still in use: the head cannot load yet
	none(t, b.submit(b.task("a")))
	a := one(t, b.complete(second, false))
	if a.Task != head || !a.Load || a.EvictLabel != "a" {
		t.Fatalf("took %s (load %v, evicting %q), want the head %s loading b evicting a",
			a.Task.ID, a.Load, a.EvictLabel, head.ID)
	}
	check(t, b.s)
}

// Rule 4's scan for tasks past their bound counts only tasks the freed worker could
// take: older tasks whose label only another, busy, worker can load do not hide an
// aged task behind them (eight of them did: the scan looked at the 8 oldest tasks).
func TestAgedTaskNotHiddenByOlderTasksTheWorkerCannotLoad(t *testing.T) {
	t.Parallel()
	// A bound of 1 ms, so that the aged task's holder is not yet past its run estimate
	// (that would make the task overdue, a different path).
	b := setup(t, Config{MaxPassOver: time.Millisecond, PassOverLoads: 0.001, FleetSettle: time.Hour})
	b.spec(WorkerSpec{ID: "gpu", MaxLabels: 1, Slots: 1, Loadable: []string{"a"}})
	b.spec(WorkerSpec{ID: "holder", MaxLabels: 1, Slots: 1, Labels: []string{"b"}, Loadable: []string{"b"}})
	if a := one(t, b.submit(b.task("a"))); a.WorkerID != "gpu" {
		t.Fatalf("first a on %s, want gpu", a.WorkerID)
	}
	for i := 0; i < 2*passOverScan; i++ {
		none(t, b.submit(b.task("a"))) // only gpu can load a, and it is busy
	}
	one(t, b.submit(b.task("b")))
	aged := b.task("b")
	none(t, b.submit(aged)) // its holder frees within 50 ms: waiting beats a load
	none(t, b.spec(WorkerSpec{ID: "w", MaxLabels: 1, Slots: 1, Loadable: []string{"b"}}))
	b.clock.advance(10 * time.Millisecond) // past the bound, not past the holder's estimate
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != aged || as[0].WorkerID != "w" || !as[0].Load {
		t.Fatalf("got %+v, want the aged %s loading b on w", as, aged.ID)
	}
	check(t, b.s)
}

// A holder that has overrun its run estimate is not taken to be about to free: the
// task waiting for it is overdue once it has waited longer than a load would take, and
// a free worker loads its label, rather than waiting out the pass-over bound (40 s).
func TestHolderPastItsRunEstimateIsNotAboutToFree(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("holder", 1, 1, "b")
	long := b.task("b")
	one(t, b.submit(long))
	waiting := b.task("b")
	none(t, b.submit(waiting)) // the holder should free within 50 ms
	none(t, b.spec(WorkerSpec{ID: "free", MaxLabels: 1, Slots: 1}))
	b.clock.advance(300 * time.Millisecond) // 250 ms past the estimate: not yet
	if as := b.s.Rebalance().Assigned; len(as) != 0 {
		t.Fatalf("assigned %+v while the holder's overrun is shorter than half a load", as)
	}
	b.clock.advance(700 * time.Millisecond)
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != waiting || as[0].WorkerID != "free" || !as[0].Load {
		t.Fatalf("got %+v, want %s loading b on the free worker", as, waiting.ID)
	}
	check(t, b.s)
}

// Random mode is one FIFO to any free worker: a worker that cannot take the head (its
// backend cannot load the head's label) takes the oldest task it can, rather than idle
// while a task submitted later is placed on it ahead of an older one.
func TestRandomModeWorkerThatCannotTakeHeadTakesOldestItCan(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Policy: PolicyRandom, Seed: 1, FleetSettle: time.Hour})
	b.spec(WorkerSpec{ID: "wa", MaxLabels: 1, Slots: 1, Loadable: []string{"a"}})
	b.spec(WorkerSpec{ID: "wb", MaxLabels: 1, Slots: 1, Loadable: []string{"b"}})
	a1, b1 := b.task("a"), b.task("b")
	if a := one(t, b.submit(a1)); a.WorkerID != "wa" {
		t.Fatalf("a1 on %s, want wa", a.WorkerID)
	}
	one(t, b.submit(b1))
	head, a2 := b.task("b"), b.task("a")
	none(t, b.submit(head)) // only wb can load b
	none(t, b.submit(a2))
	if a := one(t, b.complete(a1, false)); a.Task != a2 || a.WorkerID != "wa" {
		t.Fatalf("wa took %s, want %s, the oldest task it can take", a.Task.ID, a2.ID)
	}
	a3 := b.task("a")
	none(t, b.submit(a3)) // wa is busy with a2: a3 queues behind it
	if a := one(t, b.complete(b1, false)); a.Task != head || a.WorkerID != "wb" {
		t.Fatalf("wb took %s, want the head %s", a.Task.ID, head.ID)
	}
	if a := one(t, b.complete(a2, false)); a.Task != a3 {
		t.Fatalf("wa took %s, want %s", a.Task.ID, a3.ID)
	}
	check(t, b.s)
}

// Rule 4's bound behind more queued tasks than the pass-over walk looks past: a worker
// whose backend lists few labels, in a queue led by a backlog only another (busy)
// worker can load. The aged task it can load must not be passed over for a younger
// task of the label it holds (the walk stopped after passOverWalk untakeable tasks, so
// the aged one was never seen).
func TestAgedTaskNotHiddenBehindALongBacklogTheWorkerCannotLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: time.Hour}) // bound: max(2 s, 100 × 400 ms) = 40 s
	b.spec(WorkerSpec{ID: "ha", MaxLabels: 1, Slots: 1, Labels: []string{"a"}, Loadable: []string{"a"}})
	b.spec(WorkerSpec{ID: "w", MaxLabels: 1, Slots: 1, Labels: []string{"c"}, Loadable: []string{"b", "c"}})
	if a := one(t, b.submit(b.task("a"))); a.WorkerID != "ha" {
		t.Fatalf("a on %s, want ha", a.WorkerID)
	}
	runC := b.task("c")
	if a := one(t, b.submit(runC)); a.WorkerID != "w" {
		t.Fatalf("c on %s, want w", a.WorkerID)
	}
	for i := 0; i < 2*passOverWalk; i++ {
		none(t, b.submit(b.task("a"))) // only ha can load a, and it is busy
	}
	aged := b.task("b")
	none(t, b.submit(aged)) // w, the only worker that can load b, is busy
	young := b.task("c")
	none(t, b.submit(young))
	b.clock.advance(time.Minute)
	a := one(t, b.complete(runC, false))
	if a.Task != aged || !a.Load || a.EvictLabel != "c" {
		t.Fatalf("w took %s (load %v, evicting %q), want the aged %s loading b evicting c",
			a.Task.ID, a.Load, a.EvictLabel, aged.ID)
	}
	check(t, b.s)
}

// The same behind tasks whose label failed to load on the freed worker, for a worker
// that can load any label: each failed load sends its task back to the front of the
// queue, excluded from that worker for good.
func TestAgedTaskNotHiddenBehindManyTasksThatFailedOnTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: time.Hour})
	b.worker("hb", 1, 1, "b")
	b.worker("hy", 1, 1, "y") // can load any label: the failed tasks may still run there
	b.worker("w", 1, 1)
	one(t, b.submit(b.task("b")))
	one(t, b.submit(b.task("y")))
	aged := b.task("b")
	none(t, b.submit(aged)) // hb frees within 50 ms: waiting beats a load on w
	for i := 0; i < 2*passOverWalk; i++ {
		x := b.task(fmt.Sprintf("x%d", i)) // a label each: none is marked failing
		if a := one(t, b.submit(x)); a.WorkerID != "w" {
			t.Fatalf("%s on %s, want w", x.ID, a.WorkerID)
		}
		if again, failed := b.loadFailed(x, "no such model"); len(again) != 0 || len(failed) != 0 {
			t.Fatalf("after the failed load of %s: assigned %+v, failed %+v; want it queued", x.ID, again, failed)
		}
	}
	b.clock.advance(time.Minute) // the aged task is past its bound (40 s)
	as := b.s.Rebalance().Assigned
	if len(as) != 1 || as[0].Task != aged || as[0].WorkerID != "w" || !as[0].Load {
		t.Fatalf("got %+v, want the aged %s loading b on w", as, aged.ID)
	}
	check(t, b.s)
}
