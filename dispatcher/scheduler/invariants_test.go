package scheduler

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"
)

// These tests came out of a review that rebuilt every index from scratch after each
// step of random operations, and reproduced liveness bugs found on the way.

// check verifies every index against a recomputation from scratch.
func check(t *testing.T, s *Scheduler) {
	t.Helper()
	runningWatched := 0
	defer func() {
		if !t.Failed() && runningWatched != len(s.runningDeadline) {
			t.Fatalf("%d running tasks with a deadline, %d in the running deadline heap", runningWatched, len(s.runningDeadline))
		}
	}()
	// Per task id, the stand-ins of overrun attempts and their highest attempt number.
	standIns, standInTop := map[string]int{}, map[string]int{}
	for _, w := range s.workers {
		free := w.isFree()
		if free != (w.freePos >= 0) || (w.freePos >= 0 && s.free.at(w.freePos) != w) {
			t.Fatalf("worker %s free=%v freePos=%d", w.id, free, w.freePos)
		}
		roomy := free && len(w.held) < w.capacity
		if roomy != (w.roomyPos >= 0) || (w.roomyPos >= 0 && s.roomy.at(w.roomyPos) != w) {
			t.Fatalf("worker %s roomy=%v roomyPos=%d", w.id, roomy, w.roomyPos)
		}
		if len(w.held) > w.capacity {
			t.Fatalf("worker %s holds %d > %d", w.id, len(w.held), w.capacity)
		}
		inUse := map[string]int{}
		type attemptKey struct {
			id string
			n  int
		}
		attempts := map[attemptKey]bool{}
		for _, r := range w.running {
			inUse[r.Label]++
			// The agent keys attempts by id and number: a second one under a key it
			// still runs is ignored as a duplicate.
			if k := (attemptKey{r.ID, r.AttemptNumber()}); attempts[k] {
				t.Fatalf("worker %s runs two attempts of %s numbered %d", w.id, r.ID, k.n)
			} else {
				attempts[k] = true
			}
			if r.state == stateOverran {
				standIns[r.ID]++
				standInTop[r.ID] = max(standInTop[r.ID], r.AttemptNumber())
			}
			if (r.state != stateRunning && r.state != stateOverran) || r.worker != w {
				t.Fatalf("running task %s bad state", r.ID)
			}
			watched := r.state == stateRunning && !r.Deadline.IsZero()
			if watched != (r.heapIdx >= 0) || (watched && s.runningDeadline[r.heapIdx] != r) {
				t.Fatalf("running task %s (state %d) heapIdx=%d in the running deadline heap wrongly", r.ID, r.state, r.heapIdx)
			}
			if watched {
				runningWatched++
			}
			if r.excludes(w.id) {
				t.Fatalf("task %s runs on %s, where its label failed to load", r.ID, w.id)
			}
			if i := w.find(r.Label); i < 0 || w.held[i].state != r.labelState {
				t.Fatalf("running task %s: its labelState is not its held label's", r.ID)
			}
		}
		for _, h := range w.held {
			if s.labels[h.label] != h.state {
				t.Fatalf("held %s on %s points at a stale labelState", h.label, w.id)
			}
			if (free && !h.doomed) != (h.idlePos >= 0) || (h.idlePos >= 0 && h.state.idle.at(h.idlePos) != w) {
				t.Fatalf("held %s on %s idlePos=%d free=%v doomed=%v", h.label, w.id, h.idlePos, free, h.doomed)
			}
			if h.doomed && h.inUse == 0 {
				t.Fatalf("doomed %s on %s outlived its last task", h.label, w.id)
			}
			if h.inUse != inUse[h.label] {
				t.Fatalf("held %s on %s inUse=%d want %d", h.label, w.id, h.inUse, inUse[h.label])
			}
			delete(inUse, h.label)
		}
		if len(inUse) != 0 {
			t.Fatalf("worker %s runs tasks for labels it does not hold: %v", w.id, inUse)
		}
		if r := w.reservedFor; r != nil && (r.state != stateQueued || r.reservedOn != w || !w.accepting) {
			t.Fatalf("worker %s reserved for task %s (state %d, reserved on %p, accepting %v)", w.id, r.ID, r.state, r.reservedOn, w.accepting)
		}
	}
	holders, active := map[string]int{}, map[string]int{}
	for _, w := range s.workers {
		for _, h := range w.held {
			holders[h.label]++
			if w.accepting && !h.doomed {
				active[h.label]++
			}
		}
	}
	if len(s.overrunHeld) != len(standIns) {
		t.Fatalf("overrunHeld has %d ids, the workers hold stand-ins of %d", len(s.overrunHeld), len(standIns))
	}
	for id, held := range standIns {
		if o := s.overrunHeld[id]; o.held != held || o.top < standInTop[id] {
			t.Fatalf("overrunHeld[%s] = %+v, want %d held, top at least %d", id, o, held, standInTop[id])
		}
	}
	queued := map[string]int{}
	n := 0
	for q := s.queue.head; q != nil; q = q.global.next {
		n++
		queued[q.Label]++
		if q.state != stateQueued {
			t.Fatalf("queued task %s state %d", q.ID, q.state)
		}
		if q.labelState != s.labels[q.Label] {
			t.Fatalf("queued task %s: its labelState is not its label's", q.ID)
		}
		if w := q.reservedOn; w != nil && (w.reservedFor != q || s.workers[w.id] != w) {
			t.Fatalf("queued task %s: reserved on %s, which is not reserved for it", q.ID, w.id)
		}
	}
	if n != s.queued {
		t.Fatalf("queued %d, list %d", s.queued, n)
	}
	for name, ls := range s.labels {
		if ls.active != active[name] {
			t.Fatalf("label %s active %d, want %d", name, ls.active, active[name])
		}
		if ls.holders != holders[name] || ls.queued != queued[name] {
			t.Fatalf("label %s holders %d/%d queued %d/%d", name, ls.holders, holders[name], ls.queued, queued[name])
		}
		if ls.holders == 0 && ls.queued == 0 {
			t.Fatalf("label %s should have been forgotten", name)
		}
		m := 0
		var fresh *Task // the last task queued on submission seen so far
		for q := ls.queue.head; q != nil; q = q.byLabel.next {
			m++
			// appendAged's premise: requeued tasks first, then the rest oldest first.
			switch {
			case q.requeued && fresh != nil:
				t.Fatalf("label %s: requeued %s behind %s, queued on submission", name, q.ID, fresh.ID)
			case !q.requeued && fresh != nil && q.Enqueued.Before(fresh.Enqueued):
				t.Fatalf("label %s: %s queued on submission behind the younger %s", name, q.ID, fresh.ID)
			case !q.requeued:
				fresh = q
			}
		}
		if m != ls.queued {
			t.Fatalf("label %s list %d queued %d", name, m, ls.queued)
		}
	}
	for name := range queued {
		if s.labels[name] == nil {
			t.Fatalf("queued label %s has no state", name)
		}
	}
	unserved := 0
	for name, ls := range s.labels {
		want := ls.queued > 0 && ls.active == 0
		if want {
			unserved++
		}
		if want != (ls.unservedPos >= 0) || (want && s.unserved[ls.unservedPos] != ls) {
			t.Fatalf("label %s: queued %d, active %d, unservedPos %d", name, ls.queued, ls.active, ls.unservedPos)
		}
	}
	if unserved != len(s.unserved) {
		t.Fatalf("%d labels unserved, the set has %d", unserved, len(s.unserved))
	}
	for i, d := range s.deadline {
		if d.heapIdx != i || d.state != stateQueued {
			t.Fatalf("heap %d: idx %d state %d", i, d.heapIdx, d.state)
		}
	}
	anyLabel, loadableBy := 0, map[string]int{}
	for _, w := range s.workers {
		if w.loadable == nil {
			anyLabel++
		}
		for l := range w.loadable {
			loadableBy[l]++
		}
	}
	if anyLabel != s.anyLabel || !maps.Equal(loadableBy, s.loadableBy) {
		t.Fatalf("loadable counts: %d any-label workers and %v, want %d and %v", s.anyLabel, s.loadableBy, anyLabel, loadableBy)
	}
}

func TestRandomOperationsKeepIndexesTrue(t *testing.T) {
	// The last variant's pass-over bound is short enough that workers free labels for aged tasks.
	for _, v := range []struct {
		pol           Policy
		passOver      time.Duration
		passOverLoads float64
	}{{PolicyAffinity, 0, 0}, {PolicyRandom, 0, 0}, {PolicyAffinity, 300 * time.Millisecond, 0.5}} {
		pol := v.pol
		for seed := uint64(0); seed < 300; seed++ {
			b := setup(t, Config{Policy: pol, Seed: seed, MaxAttempts: 2, FleetSettle: time.Second, // short: the sweep of unloadable queued tasks runs too
				MaxPassOver: v.passOver, PassOverLoads: v.passOverLoads})
			r := rand.New(rand.NewPCG(seed, 7))
			var tasks []*Task
			for step := 0; step < 400; step++ {
				switch op := r.IntN(13); op {
				case 0:
					id := fmt.Sprintf("w%d", r.IntN(5))
					var ls []string
					for k := r.IntN(3); k > 0; k-- {
						ls = append(ls, fmt.Sprintf("L%d", r.IntN(6)))
					}
					var loadable []string // a backend that lists what it can load, now and then
					if r.IntN(3) == 0 {
						loadable = append(ls, fmt.Sprintf("L%d", r.IntN(6)))
					}
					b.s.AddWorker(WorkerSpec{ID: id, MaxLabels: 1 + r.IntN(2), Slots: 1 + r.IntN(2), Labels: ls, Loadable: loadable})
				case 1:
					b.s.RemoveWorker(fmt.Sprintf("w%d", r.IntN(5)))
				case 2, 3, 4:
					tk := &Task{ID: fmt.Sprint(step), Label: fmt.Sprintf("L%d", r.IntN(6))}
					if r.IntN(2) == 0 {
						tk.Deadline = b.clock.now.Add(time.Duration(r.IntN(3000)) * time.Millisecond)
					}
					b.s.Submit(tk)
					tasks = append(tasks, tk)
				case 5, 6:
					for _, tk := range tasks {
						if tk.Running() {
							switch r.IntN(5) {
							case 0:
								b.s.Requeue(tk.WorkerID(), tk)
							case 1:
								if r.IntN(2) == 0 { // the attempt started the load: its event comes first
									b.s.LabelLoadFailed(tk.WorkerID(), tk.Label, "no memory")
								}
								b.s.LoadFailed(tk.WorkerID(), tk, "no memory")
							default:
								b.s.Complete(tk.WorkerID(), tk, Observation{Loaded: r.IntN(2) == 0, LoadTime: 400 * time.Millisecond, RunTime: time.Duration(r.IntN(200)) * time.Millisecond, Failed: r.IntN(4) == 0})
							}
							break
						}
					}
				case 7:
					b.s.SetAccepting(fmt.Sprintf("w%d", r.IntN(5)), r.IntN(3) != 0)
				case 8:
					switch r.IntN(3) {
					case 0:
						b.s.LabelLoaded(fmt.Sprintf("w%d", r.IntN(5)), fmt.Sprintf("L%d", r.IntN(6)))
					case 1:
						b.s.LabelLoading(fmt.Sprintf("w%d", r.IntN(5)), fmt.Sprintf("L%d", r.IntN(6)))
					default:
						b.s.LabelGone(fmt.Sprintf("w%d", r.IntN(5)), fmt.Sprintf("L%d", r.IntN(6)))
					}
				case 9:
					b.clock.advance(time.Duration(r.IntN(500)) * time.Millisecond)
					b.s.Expire()
					b.s.ExpireRunning(time.Duration(r.IntN(1000)) * time.Millisecond)
					if r.IntN(3) == 0 && len(tasks) > 0 {
						b.s.Cancel(tasks[r.IntN(len(tasks))])
					}
				case 10:
					if r.IntN(2) == 0 { // the late result of an overrun attempt
						endOverrun(b.s, r.IntN(2) == 0, r.IntN(2) == 0)
						break
					}
					for _, tk := range tasks {
						if tk.Running() {
							b.s.Abandon(tk)
							break
						}
					}
				case 11:
					b.s.Rebalance()
					liveHead(t, b.s)
				case 12: // a backend's repository changed
					var loadable []string
					for k := r.IntN(4); k > 0; k-- {
						loadable = append(loadable, fmt.Sprintf("L%d", r.IntN(6)))
					}
					b.s.SetLoadable(fmt.Sprintf("w%d", r.IntN(5)), loadable)
				}
				check(t, b.s)
			}
		}
	}
}

// endOverrun ends the first overrun attempt found, as its worker's late result does.
func endOverrun(s *Scheduler, loaded, failed bool) {
	for i := range 5 {
		w := s.workers[fmt.Sprintf("w%d", i)]
		if w == nil {
			continue
		}
		for _, t := range w.running {
			if t.state == stateOverran {
				s.EndOverrun(w.id, t.ID, t.AttemptNumber(), Observation{Loaded: loaded, Failed: failed, LoadTime: time.Second})
				return
			}
		}
	}
}

// liveHead: after Rebalance, the head of the queue is not left waiting when a free
// worker can take it and it has no one else to wait for (no active holder, overdue, or
// passed over too long). A worker freeing a label for an aged task does not take it.
func liveHead(t *testing.T, s *Scheduler) {
	t.Helper()
	head := s.queue.head
	if head == nil || s.cfg.Policy == PolicyRandom {
		return
	}
	ls := s.labels[head.Label]
	for i := 0; i < s.free.len(); i++ {
		w := s.free.at(i)
		if ls.active > 0 && !s.overdue(head, s.regret(w, head)) && !s.passedOverTooLong(head) {
			continue
		}
		if w.takes(head) && s.canTake(w, head) {
			t.Fatalf("head %s (label %s, active holders %d) waits while free worker %s could take it",
				head.ID, head.Label, ls.active, s.free.at(i).id)
		}
	}
}

// Liveness: a queued task is never run while a free worker idles after its label's
// holder drains and leaves.
func TestRegressionStuckAfterHolderDrains(t *testing.T) {
	b := setup(t, Config{})
	b.worker("h", 1, 1, "A")
	b.worker("f", 1, 1)
	t1 := b.task("A")
	one(t, b.submit(t1))
	x := b.task("A")
	none(t, b.submit(x)) // waits for the busy holder
	b.s.SetAccepting("h", false)
	none(t, b.complete(t1, false))
	if _, err := b.s.RemoveWorker("h"); err != nil {
		t.Fatal(err)
	}
	if x.Queued() {
		t.Fatal("task stuck while a free worker could load its label")
	}
}

func TestRegressionStuckAfterHolderLostAtMaxAttempts(t *testing.T) {
	b := setup(t, Config{MaxAttempts: 1})
	b.worker("h", 1, 1, "A")
	b.worker("f", 1, 1)
	t1 := b.task("A")
	one(t, b.submit(t1))
	x := b.task("A")
	none(t, b.submit(x))
	out, _ := b.s.RemoveWorker("h")
	if len(out.Failed) != 1 {
		t.Fatalf("want t1 failed")
	}
	if x.Queued() {
		t.Fatal("task stuck while a free worker could load its label")
	}
}

// LOAD_FAILED arrives while the loading task is in use: ignored, and the label stays
// "held" for ever after.
func TestRegressionLoadFailedWhileInUse(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w", 2, 1)
	t1 := b.task("A")
	a := one(t, b.submit(t1))
	if !a.Load {
		t.Fatal("want a load")
	}
	b.s.LabelGone("w", "A") // KIND_LOAD_FAILED, sent before the failed result
	b.complete(t1, false)
	if v, _ := b.s.Worker("w"); len(v.Labels) != 0 {
		t.Fatalf("scheduler still believes w holds %v after its load failed", v.Labels)
	}
}

// An EVICTED event for a copy a task unloaded arrives after the assignment that loads
// the label again on the same worker: the new copy was doomed and dropped with its
// task, though the worker's LOADED event followed.
func TestRegressionStaleEvictionDropsReloadedLabel(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w1", 2, 2, "A", "C")
	b.clock.advance(10 * time.Second) // past the churn guard
	t1 := b.task("B")
	if a := one(t, b.submit(t1)); a.EvictLabel != "A" {
		t.Fatalf("want B loaded in place of A, got %+v", a)
	}
	t2 := b.task("A")
	if a := one(t, b.submit(t2)); a.WorkerID != "w1" || a.EvictLabel != "C" {
		t.Fatalf("want A loaded back on w1 in place of C, got %+v", a)
	}
	// What the agent reports, in order: t1's unload of A, then t2's unload of C and
	// the two loads.
	b.s.LabelGone("w1", "A")
	b.s.LabelGone("w1", "C")
	b.s.LabelLoaded("w1", "B")
	b.s.LabelLoaded("w1", "A")
	b.complete(t1, true)
	b.complete(t2, true)
	v, _ := b.s.Worker("w1")
	if got := fmt.Sprint(v.Labels); got != "[A B]" && got != "[B A]" {
		t.Fatalf("w1 holds %s in the scheduler's view; the worker holds A and B", got)
	}
	check(t, b.s)
}

// An attempt assigned to load a label that ended before the load started (its deadline
// passed on the way, or the worker refused it) left the copy "pending" for good: the
// scheduler believed the worker held a label it never loaded.
func TestRegressionUnstartedLoadLeftAPhantomCopy(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w1", 1, 1, "A")
	b.clock.advance(10 * time.Second) // past the churn guard
	labels := func() string { v, _ := b.s.Worker("w1"); return fmt.Sprint(v.Labels) }

	t1 := b.task("B")
	if a := one(t, b.submit(t1)); !a.Load || a.EvictLabel != "A" {
		t.Fatalf("want B loaded in place of A, got %+v", a)
	}
	if _, err := b.s.Complete("w1", t1, Observation{Failed: true}); err != nil { // over before it began
		t.Fatal(err)
	}
	if got := labels(); got != "[]" {
		t.Fatalf("after an attempt that never started its load, w1 holds %s", got)
	}
	b.s.LabelLoaded("w1", "A") // the agent says it kept A
	if got := labels(); got != "[A]" {
		t.Fatalf("after the agent confirmed A, w1 holds %s", got)
	}

	// A load that did start (LOADING) stays counted when the attempt fails: another
	// attempt may be waiting for it, and LOADED or LOAD_FAILED will settle it.
	t2 := b.task("B")
	one(t, b.submit(t2))
	b.s.LabelLoading("w1", "B")
	if _, err := b.s.Complete("w1", t2, Observation{Failed: true}); err != nil {
		t.Fatal(err)
	}
	if got := labels(); got != "[B]" {
		t.Fatalf("after a failed attempt whose load had started, w1 holds %s", got)
	}

	// A refusal is an attempt that never started.
	b2 := setup(t, Config{})
	b2.worker("w1", 2, 1)
	t3 := b2.task("C")
	if a := one(t, b2.submit(t3)); !a.Load {
		t.Fatalf("want a load, got %+v", a)
	}
	if _, err := b2.s.Requeue("w1", t3); err != nil {
		t.Fatal(err)
	}
	if v, _ := b2.s.Worker("w1"); len(v.Labels) != 0 {
		t.Fatalf("after a refused load, w1 holds %v", v.Labels)
	}
	check(t, b.s)
	check(t, b2.s)
}

// Rule 4 returns the aged head even when the worker cannot load it, and fill stops
// though the worker could run a queued task for the label it holds.
func TestRegressionPickRefusedStopsFill(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w", 1, 2, "A")
	a1 := b.task("A")
	one(t, b.submit(a1))
	a2 := b.task("A")
	one(t, b.submit(a2)) // w full now (2 slots)
	bt := b.task("B")
	none(t, b.submit(bt)) // every label of w in use: waits
	a3 := b.task("A")
	none(t, b.submit(a3))
	b.clock.advance(3 * time.Second)
	as := b.complete(a1, false) // one slot free; head bt is aged but A is in use (a2)
	if len(as) == 0 {
		t.Fatalf("w has a free slot and holds A, yet queued A task %s is not started (pick chose %s)", a3.ID, bt.ID)
	}
}

// Requeue offers the refused task straight back to the worker that refused it.
func TestRegressionRequeueBouncesToRefuser(t *testing.T) {
	b := setup(t, Config{})
	b.worker("w", 1, 1, "A")
	b.worker("f", 1, 1, "B")
	t1 := b.task("A")
	one(t, b.submit(t1))
	out, _ := b.s.Requeue("w", t1)
	if len(out.Assigned) == 1 && out.Assigned[0].WorkerID == "w" {
		t.Fatalf("refused task offered straight back to the refusing worker (attempt %d)", t1.Attempt)
	}
}

// A task waiting for a busy holder is never reconsidered while another worker idles:
// nothing re-evaluates the wait when it runs far past the estimate.
func TestRegressionWaitNeverReconsidered(t *testing.T) {
	b := setup(t, Config{})
	b.worker("h", 1, 1, "A")
	b.worker("f", 1, 1)
	one(t, b.submit(b.task("A")))
	x := b.task("A")
	none(t, b.submit(x))
	b.clock.advance(time.Minute)
	out := b.s.Rebalance()
	if x.Queued() || len(out.Assigned) != 1 || out.Assigned[0].WorkerID != "f" {
		t.Fatalf("after waiting a minute for a busy holder: queued=%v, assigned %+v", x.Queued(), out.Assigned)
	}
}

// Random mode: place tries one random free worker; if it cannot load, the task queues
// though another free worker could run it at once.
func TestRegressionRandomPlaceGivesUp(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		b := setup(t, Config{Policy: PolicyRandom, Seed: seed})
		b.worker("busy", 1, 2, "A")
		b.worker("idle", 1, 1, "C")
		// occupy one slot of "busy" with A
		var a1 *Task
		for {
			a1 = b.task("A")
			as := b.submit(a1)
			if len(as) == 1 && as[0].WorkerID == "busy" {
				break
			}
			b.complete(a1, false)
		}
		x := b.task("B")
		b.submit(x)
		if x.Queued() {
			t.Fatalf("seed %d: task queued while the idle worker could load it", seed)
		}
	}
}
