package scheduler

import (
	"fmt"
	"testing"
	"time"
)

// Tasks that could start at once must not wait for a Rebalance to come round: it
// visits only rebalanceTries free workers per call. These are the changes within a
// call that leave a free worker able to take a waiting task.

// A worker reserved for an aged task takes no tasks of the label it frees; when another
// worker takes the aged task, the reservation goes and the worker takes the task of
// that label that waited meanwhile, in the same call, however many workers are free.
func TestWorkerFreedOfItsReservationTakesWaitingTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{}) // pass-over bound 40 s
	b.worker("w1", 1, 2, "a")
	b.worker("w2", 1, 1, "c")
	for i := 0; i < 10*rebalanceTries; i++ { // free, and no use to anyone here
		b.spec(WorkerSpec{ID: fmt.Sprintf("z%03d", i), MaxLabels: 1, Slots: 1, Loadable: []string{"z"}})
	}
	a1, a2, c1 := b.task("a"), b.task("a"), b.task("c")
	one(t, b.submit(a1))
	one(t, b.submit(a2))
	one(t, b.submit(c1))
	aged := b.task("b")
	none(t, b.submit(aged)) // w1's only label is in use, w2 is busy
	b.clock.advance(time.Minute)
	none(t, b.complete(a1, false)) // w1 reserves itself for the aged task, freeing a
	a3 := b.task("a")
	none(t, b.submit(a3)) // not to w1 while it frees a
	as := b.complete(c1, false)
	if len(as) != 2 || as[0].Task != aged || as[0].WorkerID != "w2" || as[1].Task != a3 || as[1].WorkerID != "w1" {
		t.Fatalf("got %+v, want the aged %s on w2, then %s on w1", as, aged.ID, a3.ID)
	}
	check(t, b.s)
}

// The same when the aged task leaves the queue by a call that returns no Outcome
// (Cancel): the next call's Outcome has the worker take the waiting task.
func TestWorkerFreedOfItsReservationByCancelTakesWaitingTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 2, "a")
	a1, a2 := b.task("a"), b.task("a")
	one(t, b.submit(a1))
	one(t, b.submit(a2))
	aged := b.task("b")
	none(t, b.submit(aged))
	b.clock.advance(time.Minute)
	none(t, b.complete(a1, false))
	a3 := b.task("a")
	none(t, b.submit(a3))
	if !b.s.Cancel(aged) {
		t.Fatal("aged task not queued")
	}
	if as := b.s.Expire().Assigned; len(as) != 1 || as[0].Task != a3 || as[0].WorkerID != "w1" {
		t.Fatalf("got %+v, want %s on w1", as, a3.ID)
	}
	check(t, b.s)
}

// A worker that evicts the only copy of a label (to load one for an aged task) leaves
// the label's queued tasks without a holder: they load on a free worker at once.
func TestEvictedSoleCopyQueueLoadsElsewhere(t *testing.T) {
	t.Parallel()
	// A 1 ms bound: the aged task passes it while its label's holder is not yet past
	// its run estimate.
	b := setup(t, Config{MaxPassOver: time.Millisecond, PassOverLoads: 0.001, FleetSettle: time.Hour})
	b.spec(WorkerSpec{ID: "holder", MaxLabels: 1, Slots: 1, Labels: []string{"b"}})
	b.spec(WorkerSpec{ID: "spare", MaxLabels: 1, Slots: 1, Loadable: []string{"b"}})
	b1 := b.task("b")
	if a := one(t, b.submit(b1)); a.WorkerID != "holder" {
		t.Fatalf("%s on %s, want holder", b1.ID, a.WorkerID)
	}
	aged := b.task("c")
	none(t, b.submit(aged)) // only the holder can load c
	b.clock.advance(10 * time.Millisecond)
	b2 := b.task("b")
	none(t, b.submit(b2)) // its holder frees within 40 ms: waiting beats a load
	as := b.complete(b1, false)
	if len(as) != 2 || as[0].Task != aged || as[0].EvictLabel != "b" ||
		as[1].Task != b2 || as[1].WorkerID != "spare" || !as[1].Load {
		t.Fatalf("got %+v, want the aged %s on holder evicting b, then %s loading b on spare", as, aged.ID, b2.ID)
	}
	check(t, b.s)
}

// An attempt that ends before the load it was assigned with began dooms the pending
// copy; when that was the label's only copy, the task queued for it loads on a free
// worker at once.
func TestDoomedPendingCopyQueueLoadsElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 2)
	a1, a2, a3 := b.task("a"), b.task("a"), b.task("a")
	if a := one(t, b.submit(a1)); !a.Load {
		t.Fatalf("want a load, got %+v", a)
	}
	if a := one(t, b.submit(a2)); a.WorkerID != "w1" || a.Load {
		t.Fatalf("want a2 to wait for the load on w1, got %+v", a)
	}
	none(t, b.submit(a3))                                         // w1 is full
	none(t, b.worker("w0", 1, 1))                                 // waiting for w1 beats a load
	out, err := b.s.Complete("w1", a2, Observation{Failed: true}) // over before the load began
	if err != nil {
		t.Fatal(err)
	}
	if as := out.Assigned; len(as) != 1 || as[0].Task != a3 || as[0].WorkerID != "w0" || !as[0].Load {
		t.Fatalf("got %+v, want %s loading a on w0", as, a3.ID)
	}
	check(t, b.s)
}

// A freed worker loads a label nobody holds however far back its task waits: the
// backlog scan looks at a bounded stretch of the queue, and a long backlog of one label
// that its holder's many slots serve soon enough (no load pays) filled it, so the worker
// idled beside the task until it aged, 40 s by default.
func TestFreedWorkerLoadsUnservedLabelBehindALongBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("ha", 1, 2*passOverWalk, "a")
	b.worker("w", 1, 1, "c")
	for i := 0; i < 2*passOverWalk; i++ {
		one(t, b.submit(b.task("a")))
	}
	runC := b.task("c")
	one(t, b.submit(runC))
	for i := 0; i < 2*passOverWalk; i++ {
		none(t, b.submit(b.task("a"))) // a slot of ha frees within 100 ms: no load pays
	}
	unserved := b.task("b")
	none(t, b.submit(unserved)) // no worker is free
	a := one(t, b.complete(runC, false))
	if a.Task != unserved || a.WorkerID != "w" || !a.Load || a.EvictLabel != "c" {
		t.Fatalf("w took %s (load %v, evicting %q), want %s loading b evicting c", a.Task.ID, a.Load, a.EvictLabel, unserved.ID)
	}
	check(t, b.s)
}

// The same behind a backlog the worker cannot load at all (its backend lists few labels).
func TestFreedWorkerLoadsUnservedLabelBehindABacklogItCannotLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: time.Hour})
	b.spec(WorkerSpec{ID: "ha", MaxLabels: 1, Slots: 1, Labels: []string{"a"}, Loadable: []string{"a"}})
	b.spec(WorkerSpec{ID: "w", MaxLabels: 1, Slots: 1, Labels: []string{"c"}, Loadable: []string{"b", "c"}})
	one(t, b.submit(b.task("a")))
	runC := b.task("c")
	one(t, b.submit(runC))
	for i := 0; i < 2*passOverWalk; i++ {
		none(t, b.submit(b.task("a"))) // only ha can load a, and it is busy
	}
	unserved := b.task("b")
	none(t, b.submit(unserved)) // w, the only worker that can load b, is busy
	a := one(t, b.complete(runC, false))
	if a.Task != unserved || a.WorkerID != "w" || !a.Load || a.EvictLabel != "c" {
		t.Fatalf("w took %s (load %v, evicting %q), want %s loading b evicting c", a.Task.ID, a.Load, a.EvictLabel, unserved.ID)
	}
	check(t, b.s)
}
