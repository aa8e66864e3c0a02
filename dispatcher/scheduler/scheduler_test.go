package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) advance(d time.Duration) { c.now = c.now.Add(d) }

type bundle struct {
	t     *testing.T
	s     *Scheduler
	clock *fakeClock
	n     int
}

func setup(t *testing.T, cfg Config) *bundle {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	s, err := New(cfg, clock)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, s: s, clock: clock}
}

func (b *bundle) worker(id string, maxLabels, slots int, labels ...string) []Assignment {
	b.t.Helper()
	out, err := b.s.AddWorker(WorkerSpec{ID: id, MaxLabels: maxLabels, Slots: slots, Labels: labels})
	if err != nil {
		b.t.Fatal(err)
	}
	return append([]Assignment(nil), out.Assigned...)
}

// spec adds a worker described in full (what it can load, say).
func (b *bundle) spec(spec WorkerSpec) []Assignment {
	b.t.Helper()
	out, err := b.s.AddWorker(spec)
	if err != nil {
		b.t.Fatal(err)
	}
	return append([]Assignment(nil), out.Assigned...)
}

func (b *bundle) task(label string) *Task {
	b.n++
	return &Task{ID: fmt.Sprintf("t%d", b.n), Label: label}
}

func (b *bundle) submit(t *Task) []Assignment {
	b.t.Helper()
	out, err := b.s.Submit(t)
	if err != nil {
		b.t.Fatal(err)
	}
	return append([]Assignment(nil), out.Assigned...)
}

func (b *bundle) complete(t *Task, loaded bool) []Assignment {
	b.t.Helper()
	out, err := b.s.Complete(t.WorkerID(), t, Observation{Loaded: loaded, RunTime: 50 * time.Millisecond})
	if err != nil {
		b.t.Fatal(err)
	}
	return append([]Assignment(nil), out.Assigned...)
}

func one(t *testing.T, as []Assignment) Assignment {
	t.Helper()
	if len(as) != 1 {
		t.Fatalf("want exactly one assignment, got %+v", as)
	}
	return as[0]
}

func none(t *testing.T, as []Assignment) {
	t.Helper()
	if len(as) != 0 {
		t.Fatalf("want no assignment, got %d: first to %s for %s", len(as), as[0].WorkerID, as[0].Task.Label)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Policy: "fastest"}, &fakeClock{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := New(Config{MaxAttempts: -1}, &fakeClock{}); err == nil {
		t.Fatal("negative MaxAttempts accepted")
	}
	if _, err := New(Config{}, nil); err == nil {
		t.Fatal("nil clock accepted")
	}
}

// PassOverLoads times a load time must be a duration: NaN, an infinity, or a number
// whose product with a load (up to a day, or the prior when longer) overflows is
// refused, rather than the bound wrapping and falling to MaxPassOver.
func TestPassOverLoadsMustFitADuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		loads float64
		prior time.Duration
		ok    bool
	}{
		{math.NaN(), 0, false},
		{math.Inf(1), 0, false},
		{1e30, 0, false},
		{106752, 0, false}, // × 24 h is past 292 years
		{106751, 0, true},
		{100, 0, true},
		{10_000, 1000 * time.Hour, false}, // a prior past a day counts as the longest load
		{10_000, time.Hour, true},
	} {
		_, err := New(Config{PassOverLoads: c.loads, LoadTimePrior: c.prior}, &fakeClock{})
		if (err == nil) != c.ok {
			t.Errorf("PassOverLoads %v with LoadTimePrior %v: %v, want ok %v", c.loads, c.prior, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "PassOverLoads") {
			t.Errorf("PassOverLoads %v: error %q does not name the field", c.loads, err)
		}
	}
}

// Rule 1: an idle worker holding the label gets the task, with no load.
func TestIdleHolderGetsTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 2, 1, "a")
	b.worker("w2", 2, 1, "b")
	a := one(t, b.submit(b.task("b")))
	if a.WorkerID != "w2" || a.Load || a.EvictLabel != "" {
		t.Fatalf("got %+v, want w2 without a load", a)
	}
}

// Rule 3: a label nobody holds loads on a worker with room before one that must evict.
func TestLoadPrefersRoomThenEvictsLRU(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("full", 2, 1, "x", "y")
	b.worker("roomy", 2, 1, "z")
	a := one(t, b.submit(b.task("new")))
	if a.WorkerID != "roomy" || !a.Load || a.EvictLabel != "" {
		t.Fatalf("got %+v, want a load on roomy without eviction", a)
	}
	// Now only "full" is free; it must evict its least recently used label, x.
	a = one(t, b.submit(b.task("other")))
	if a.WorkerID != "full" || a.EvictLabel != "x" {
		t.Fatalf("got %+v, want full evicting x", a)
	}
	v, _ := b.s.Worker("full")
	if fmt.Sprint(v.Labels) != "[y other]" {
		t.Fatalf("full holds %v, want [y other]", v.Labels)
	}
}

// Rule 2 (the seam): with one busy holder and a short queue, waiting beats a load; with
// a long backlog, a free worker loads the label.
func TestWaitOrLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
	b.worker("holder", 2, 1, "hot")
	b.worker("spare", 2, 1, "cold")
	first := b.task("hot")
	one(t, b.submit(first))
	// With k tasks ahead the wait is 50ms (the running task's rest) + k×50ms + 50ms;
	// a load costs 400ms + 50ms run + a 200ms margin. Up to 11 ahead: wait.
	for i := 0; i < 12; i++ {
		none(t, b.submit(b.task("hot")))
	}
	// Twelve ahead: 700ms > 650ms: load on the spare worker.
	a := one(t, b.submit(b.task("hot")))
	if a.WorkerID != "spare" || !a.Load {
		t.Fatalf("got %+v, want a load on spare", a)
	}
	// The holder frees and takes the oldest hot task, no load.
	a = one(t, b.complete(first, false))
	if a.WorkerID != "holder" || a.Load || a.Task.ID != "t2" {
		t.Fatalf("got %+v (task %s), want holder taking t2 without load", a, a.Task.ID)
	}
}

// Rule 2 learns: the first load observed for a label replaces the prior. Pulled from a
// 400 ms prior by a 0.2-weight average, a label that loads in 10 ms still looked like
// 322 ms after its first load, never earned a copy, and so never taught the scheduler
// more: the throughput benchmark kept five labels on three of eight agents.
func TestFirstLoadReplacesThePrior(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
	b.worker("holder", 2, 1)
	b.worker("spare", 1, 1, "cold")
	first := b.task("quick")
	if a := one(t, b.submit(first)); a.WorkerID != "holder" || !a.Load {
		t.Fatalf("got %+v, want a load on holder, which has room", a)
	}
	out, err := b.s.Complete("holder", first, Observation{Loaded: true, LoadTime: 10 * time.Millisecond, RunTime: 50 * time.Millisecond})
	if err != nil || len(out.Assigned) != 0 {
		t.Fatalf("complete: %v, %+v", err, out.Assigned)
	}
	if got := b.s.stats("quick").load; got != 10*time.Millisecond {
		t.Fatalf("load estimate %v after one 10ms load, want 10ms", got)
	}
	one(t, b.submit(b.task("quick"))) // holder again, now busy for 50ms
	// Waiting costs the running task's 50ms and its own 50ms run; a load on spare 10ms,
	// 5ms margin and the run.
	if a := one(t, b.submit(b.task("quick"))); a.WorkerID != "spare" || !a.Load || a.EvictLabel != "cold" {
		t.Fatalf("got %+v, want spare loading quick in place of cold", a)
	}
}

// Rule 2 on workers that run several tasks at once: the queue ahead is shared among the
// holders' slots, not the holders. Counted per holder, a 4-slot holder's wait looked
// four times longer than it is and loaded copies it did not need.
func TestWaitCountsHolderSlots(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
	b.worker("holder", 2, 4, "hot")
	b.worker("spare", 2, 1, "cold")
	for i := 0; i < 4; i++ {
		if a := one(t, b.submit(b.task("hot"))); a.WorkerID != "holder" {
			t.Fatalf("got %+v, want holder", a)
		}
	}
	// With k ahead the wait is 50ms (the running tasks' rest) + k/4×50ms + 50ms; a load
	// costs 650ms as in TestWaitOrLoad. Up to 44 ahead: wait (per holder: up to 11).
	for i := 0; i < 45; i++ {
		none(t, b.submit(b.task("hot")))
	}
	if a := one(t, b.submit(b.task("hot"))); a.WorkerID != "spare" || !a.Load {
		t.Fatalf("got %+v, want a load on spare at 45 ahead", a)
	}
}

// Rule 2's hot label: when a label's tasks have kept arriving faster than its holders
// run them, the backlog only grows, so a copy loads as soon as that has lasted a load
// time, not once the queue is a load and a half long. Demand the holders keep up with,
// or outpace by less than a quarter, loads nothing.
func TestOutpacedHoldersEarnACopy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		slots int
		every int // a task arrives every this many 5 ms steps; a run takes 10
		// wantLoad: a copy loads 400-450 ms in (the arrivals must first span a load),
		// with fewer queued than make waiting dearer than a load by itself (maxQueued).
		wantLoad  bool
		maxQueued int
	}{
		{"twice the holder's pace", 1, 5, true, 12},
		{"1.67 times two slots' pace", 2, 3, true, 24},
		{"1.11 times the holder's pace", 1, 9, false, 0},
		{"the holder's pace", 1, 10, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const step, run = 5 * time.Millisecond, 50 * time.Millisecond
			b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: run})
			b.worker("holder", 2, tc.slots, "hot")
			b.worker("spare", 2, 1, "cold")
			start := b.clock.now
			ends := map[*Task]time.Time{} // the holder's running tasks
			loadedAt, queuedThen := time.Duration(-1), 0
			note := func(as []Assignment) {
				for _, a := range as {
					if a.WorkerID == "holder" {
						ends[a.Task] = b.clock.now.Add(run)
					} else if a.Load && loadedAt < 0 {
						loadedAt, queuedThen = b.clock.now.Sub(start), b.s.Queued("hot")
					}
				}
			}
			for i := 0; i < 400 && loadedAt < 0; i++ { // two seconds
				for task, end := range ends {
					if !b.clock.now.Before(end) {
						delete(ends, task)
						note(b.complete(task, false))
					}
				}
				if i%tc.every == 0 {
					note(b.submit(b.task("hot")))
				}
				b.clock.advance(step)
			}
			switch {
			case !tc.wantLoad && loadedAt >= 0:
				t.Fatalf("loaded a copy at %v (%d queued) for demand the holder keeps up with", loadedAt, queuedThen)
			case tc.wantLoad && loadedAt < 0:
				t.Fatal("no copy loaded in two seconds")
			case tc.wantLoad && (loadedAt < 400*time.Millisecond || loadedAt > 450*time.Millisecond || queuedThen >= tc.maxQueued):
				t.Fatalf("loaded a copy at %v with %d queued, want at 400-450ms with fewer than %d", loadedAt, queuedThen, tc.maxQueued)
			}
		})
	}
}

// A burst at one instant, however long a load after it the holders take to drain it,
// is not demand outpacing them: no free worker loads a copy as the queue shrinks.
func TestBurstOnBusyHoldersLoadsNoCopy(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
	for i := 0; i < 4; i++ {
		b.worker(fmt.Sprintf("holder%d", i), 2, 1, "hot")
	}
	for i := 0; i < 7; i++ {
		b.worker(fmt.Sprintf("spare%d", i), 1, 1, fmt.Sprintf("cold%d", i))
	}
	var running []*Task
	note := func(as []Assignment) {
		for _, a := range as {
			if a.Load {
				t.Fatalf("%s loads hot at %v with %d queued", a.WorkerID, b.clock.now.Sub(time.Unix(1_700_000_000, 0)), b.s.Queued("hot"))
			}
			running = append(running, a.Task)
		}
	}
	for i := 0; i < 44; i++ { // 11 runs of the four holders: 550 ms
		note(b.submit(b.task("hot")))
	}
	for b.s.Queued("hot") > 0 {
		b.clock.advance(50 * time.Millisecond)
		done := running
		running = nil
		for _, task := range done {
			note(b.complete(task, false))
		}
		note(b.s.Rebalance().Assigned)
	}
}

// Rule 2 counts only the holder slots that can serve the label: its free ones and those
// running it. Slots busy with another label's long tasks do not drain its queue.
func TestWaitCountsOnlySlotsTheLabelCanUse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
	b.worker("holder", 2, 4, "long", "hot")
	b.worker("spare", 2, 1, "cold")
	first := b.task("long")
	one(t, b.submit(first))
	if _, err := b.s.Complete("holder", first, Observation{RunTime: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if a := one(t, b.submit(b.task("long"))); a.WorkerID != "holder" {
			t.Fatalf("got %+v, want holder", a)
		}
	}
	if a := one(t, b.submit(b.task("hot"))); a.WorkerID != "holder" {
		t.Fatalf("got %+v, want holder's last slot", a)
	}
	// One slot serves hot: with k ahead the wait is 50ms + k×50ms + 50ms, against a
	// load's 650ms, as in TestWaitOrLoad. Counted as 4 slots it would wait to 44 ahead.
	for i := 0; i < 12; i++ {
		none(t, b.submit(b.task("hot")))
	}
	if a := one(t, b.submit(b.task("hot"))); a.WorkerID != "spare" || !a.Load {
		t.Fatalf("got %+v, want a load on spare at 12 ahead", a)
	}
}

// The first loads measured for a label are averaged evenly, so one slow first load
// (a cold disk) does not stand for the label's cost for long.
func TestFirstLoadsAveragedEvenly(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond})
	b.worker("w", 1, 1, "slow") // known while held
	for _, load := range []time.Duration{30 * time.Second, 2 * time.Second} {
		b.s.observe("slow", Observation{Loaded: true, LoadTime: load, RunTime: time.Millisecond})
	}
	if got := b.s.stats("slow").load; got != 16*time.Second {
		t.Fatalf("load estimate %v after loads of 30s and 2s, want their mean, 16s", got)
	}
}

// Rule 4: a freed worker takes the oldest task for a label it holds, even when an
// older task for another label waits.
func TestFreedWorkerPrefersItsLabels(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxPassOver: time.Hour, PassOverLoads: 1})
	b.worker("w1", 2, 1, "a")
	running := b.task("a")
	one(t, b.submit(running))
	other := b.task("b")
	none(t, b.submit(other)) // no free worker at all
	mine := b.task("a")
	none(t, b.submit(mine))
	a := one(t, b.complete(running, false))
	if a.Task != mine || a.Load {
		t.Fatalf("took %s (load %v), want %s without load", a.Task.ID, a.Load, mine.ID)
	}
	// With no task for its labels left, it takes the oldest task overall and loads.
	a = one(t, b.complete(mine, false))
	if a.Task != other || !a.Load {
		t.Fatalf("took %s, want %s with a load", a.Task.ID, other.ID)
	}
}

// Rule 4's bound: a task passed over for MaxPassOver goes first.
func TestNoStarvation(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxPassOver: time.Second, PassOverLoads: 1}) // bound max(1s, 1 × 400ms)
	b.worker("w1", 1, 1, "a")
	running := b.task("a")
	one(t, b.submit(running))
	starving := b.task("b")
	none(t, b.submit(starving))
	// Keep w1 fed with label a for less than the bound: b keeps waiting.
	for i := 0; i < 3; i++ {
		next := b.task("a")
		none(t, b.submit(next))
		b.clock.advance(200 * time.Millisecond)
		a := one(t, b.complete(running, false))
		if a.Task != next {
			t.Fatalf("round %d: took %s, want %s", i, a.Task.ID, next.ID)
		}
		running = next
	}
	none(t, b.submit(b.task("a")))
	b.clock.advance(time.Second)
	a := one(t, b.complete(running, false))
	if a.Task != starving || a.EvictLabel != "a" {
		t.Fatalf("took %s evicting %q, want the starving %s evicting a", a.Task.ID, a.EvictLabel, starving.ID)
	}
}

// No herding: a burst for a new label starts one load, not one per free worker.
func TestBurstLoadsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for i := 0; i < 4; i++ {
		b.worker(fmt.Sprintf("w%d", i), 2, 1)
	}
	loads := 0
	for i := 0; i < 5; i++ {
		for _, a := range b.submit(b.task("new")) {
			if a.Load {
				loads++
			}
		}
	}
	if loads != 1 {
		t.Fatalf("burst of 5 started %d loads, want 1", loads)
	}
	if q := b.s.Queued("new"); q != 4 {
		t.Fatalf("queued %d, want 4 waiting for the loading holder", q)
	}
}

// A label with a running task is never evicted under it.
func TestNoEvictionOfLabelInUse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 2, "a")
	one(t, b.submit(b.task("a")))
	// w1 has a free slot but its only label is in use: the b task must wait.
	none(t, b.submit(b.task("b")))
}

// Rule 5: random mode is one FIFO: a freed worker takes the head whatever its label.
func TestRandomModeFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Policy: PolicyRandom, Seed: 7})
	b.worker("w1", 2, 1, "a")
	first := b.task("a")
	one(t, b.submit(first))
	head := b.task("b")
	none(t, b.submit(head))
	none(t, b.submit(b.task("a")))
	a := one(t, b.complete(first, false))
	if a.Task != head || !a.Load {
		t.Fatalf("took %s, want the FIFO head %s with a load", a.Task.ID, head.ID)
	}
}

func TestRandomModeDeterministic(t *testing.T) {
	t.Parallel()
	run := func() string {
		b := setup(t, Config{Policy: PolicyRandom, Seed: 42})
		for i := 0; i < 8; i++ {
			b.worker(fmt.Sprintf("w%d", i), 2, 1)
		}
		trace := ""
		for i := 0; i < 8; i++ {
			a := one(t, b.submit(b.task(fmt.Sprintf("l%d", i%3))))
			trace += a.WorkerID + ","
		}
		return trace
	}
	if x, y := run(), run(); x != y {
		t.Fatalf("same seed, different choices:\n%s\n%s", x, y)
	}
}

// Rule 6: a queued task whose deadline passes fails and is never assigned.
func TestDeadlineFailsQueuedTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	late := b.task("a")
	late.Deadline = b.clock.now.Add(time.Second)
	later := b.task("a")
	later.Deadline = b.clock.now.Add(time.Minute)
	none(t, b.submit(late))
	none(t, b.submit(later))
	if d, ok := b.s.NextDeadline(); !ok || !d.Equal(late.Deadline) {
		t.Fatalf("NextDeadline = %v %v", d, ok)
	}
	if out := b.s.Expire(); len(out.Failed) != 0 {
		t.Fatalf("expired early: %+v", out.Failed)
	}
	b.clock.advance(time.Second)
	out := b.s.Expire()
	if len(out.Failed) != 1 || out.Failed[0].Task != late || out.Failed[0].Reason != FailDeadline {
		t.Fatalf("got %+v, want %s failed on deadline", out.Failed, late.ID)
	}
	a := one(t, b.worker("w1", 1, 1))
	if a.Task != later {
		t.Fatalf("new worker took %s, want %s", a.Task.ID, later.ID)
	}
}

// Rule 7: a lost worker's task goes to the front of the queue and runs elsewhere, up to
// MaxAttempts.
func TestLostWorkerRequeuesThenFails(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxAttempts: 2})
	b.worker("w1", 1, 1, "a")
	task := b.task("a")
	one(t, b.submit(task))
	queuedBehind := b.task("a")
	none(t, b.submit(queuedBehind))
	// w2 joins holding the label: it takes the queued task.
	if a := one(t, b.worker("w2", 1, 1, "a")); a.Task != queuedBehind {
		t.Fatalf("w2 took %s", a.Task.ID)
	}
	out, err := b.s.RemoveWorker("w1")
	if err != nil || len(out.Assigned) != 0 || len(out.Failed) != 0 {
		t.Fatalf("remove w1: %+v %v", out, err)
	}
	if !task.Queued() {
		t.Fatal("lost task not requeued")
	}
	// w3 joins holding the label and takes the requeued task first: attempt 2.
	a := one(t, b.worker("w3", 1, 1, "a"))
	if a.Task != task || task.Attempt != 2 {
		t.Fatalf("w3 took %s attempt %d", a.Task.ID, task.Attempt)
	}
	out, _ = b.s.RemoveWorker("w3")
	if len(out.Failed) != 1 || out.Failed[0].Reason != FailAttempts {
		t.Fatalf("after MaxAttempts want a failure, got %+v", out)
	}
}

func TestCompleteChecksOwnership(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 1, "a")
	b.worker("w2", 1, 1, "b")
	task := b.task("a")
	one(t, b.submit(task))
	if _, err := b.s.Complete("w2", task, Observation{}); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("complete on the wrong worker: %v", err)
	}
	if _, err := b.s.Complete("nobody", task, Observation{}); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("complete on an unknown worker: %v", err)
	}
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 1, Slots: 1}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate worker: %v", err)
	}
	if _, err := b.s.Submit(task); !errors.Is(err, ErrTaskInUse) {
		t.Fatalf("resubmit of a running task: %v", err)
	}
}

// The worker's own view wins: a label it reports gone is no longer routed to it.
func TestLabelEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 2, 1, "a")
	b.s.LabelGone("w1", "a")
	if a := one(t, b.submit(b.task("a"))); !a.Load {
		t.Fatal("label reported gone still treated as held")
	}
	b2 := setup(t, Config{})
	b2.worker("w1", 1, 1, "a")
	b2.s.LabelLoaded("w1", "z")
	v, _ := b2.s.Worker("w1")
	if fmt.Sprint(v.Labels) != "[z]" {
		t.Fatalf("labels %v, want [z]", v.Labels)
	}
}

// A label no connected worker's backend lists fails at once once the fleet has been
// unchanged for FleetSettle; with no worker connected, or while workers come and go,
// the task waits as usual.
func TestNoWorkerCanLoadFailsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: 10 * time.Second})
	waiting := b.task("X")
	none(t, b.submit(waiting)) // no worker yet: it waits
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 2, Slots: 1, Loadable: []string{"X", "Y"}}); err != nil {
		t.Fatal(err)
	}
	if !waiting.Running() {
		t.Fatal("the waiting task did not go to the worker that can load it")
	}
	early := b.task("x-typo")
	if out, _ := b.s.Submit(early); len(out.Failed) != 0 || !early.Queued() {
		t.Fatalf("within FleetSettle of a worker connecting: %+v", out)
	}
	b.clock.advance(10 * time.Second)
	typo := b.task("x-typo")
	out, _ := b.s.Submit(typo)
	if len(out.Failed) != 1 || out.Failed[0].Reason != FailNoWorkerCanLoad || len(out.Assigned) != 0 || typo.Queued() {
		t.Fatalf("task for a label no worker can load: %+v", out)
	}
	if out, _ := b.s.Submit(b.task("Y")); len(out.Failed) != 0 {
		t.Fatalf("task for a loadable label failed: %+v", out.Failed)
	}
	// A worker that loads anything makes every label possible, until it goes.
	if _, err := b.s.AddWorker(WorkerSpec{ID: "any", MaxLabels: 1, Slots: 1}); err != nil {
		t.Fatal(err)
	}
	if out, _ := b.s.Submit(b.task("x-typo")); len(out.Failed) != 0 {
		t.Fatalf("failed with a worker that loads any label: %+v", out.Failed)
	}
	if _, err := b.s.RemoveWorker("any"); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	if out, _ := b.s.Submit(b.task("z-typo")); len(out.Failed) != 1 || out.Failed[0].Reason != FailNoWorkerCanLoad {
		t.Fatalf("after the any-label worker left: %+v", out)
	}
	// An Inventory that repeats the list changes nothing: it must not start the wait
	// again, or a worker resending it would keep every misspelt label waiting.
	if _, err := b.s.SetLoadable("w1", []string{"Y", "X"}); err != nil {
		t.Fatal(err)
	}
	if out, _ := b.s.Submit(b.task("z-typo")); len(out.Failed) != 1 || out.Failed[0].Reason != FailNoWorkerCanLoad {
		t.Fatalf("after an unchanged Inventory: %+v", out)
	}
	check(t, b.s)
}

// A worker whose backend gains a label (a model added to Triton's repository) takes
// the tasks queued for it, and new tasks for it no longer fail; one that loses a label
// keeps running tasks on the copy it holds, and loads it no more.
func TestSetLoadable(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: 10 * time.Second})
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 2, Slots: 1, Loadable: []string{"X"}}); err != nil {
		t.Fatal(err)
	}
	early := b.task("new")
	none(t, b.submit(early)) // within FleetSettle it waits
	out, err := b.s.SetLoadable("w1", []string{"X", "new"})
	if err != nil {
		t.Fatal(err)
	}
	if a := one(t, out.Assigned); a.Task != early || a.WorkerID != "w1" || !a.Load {
		t.Fatalf("w1 took %+v, want the queued task for the label it can load now", a)
	}
	b.complete(early, true)
	check(t, b.s)

	b.clock.advance(10 * time.Second)
	later := b.task("later")
	if out, _ := b.s.Submit(later); len(out.Failed) != 1 || out.Failed[0].Reason != FailNoWorkerCanLoad {
		t.Fatalf("label no backend lists: %+v", out)
	}
	if _, err := b.s.SetLoadable("w1", []string{"X", "new", "later"}); err != nil {
		t.Fatal(err)
	}
	later = b.task("later")
	if a := one(t, b.submit(later)); a.WorkerID != "w1" || !a.Load {
		t.Fatalf("label the backend lists now: %+v", a)
	}
	b.complete(later, true)
	check(t, b.s)

	// "new" leaves the backend's list while w1 holds it (with "later").
	if _, err := b.s.SetLoadable("w1", []string{"X", "later"}); err != nil {
		t.Fatal(err)
	}
	held := b.task("new")
	if a := one(t, b.submit(held)); a.WorkerID != "w1" || a.Load {
		t.Fatalf("task for the copy w1 still holds: %+v", a)
	}
	b.complete(held, false)
	check(t, b.s)
	if _, err := b.s.SetLoadable("gone", nil); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("SetLoadable of an unknown worker = %v", err)
	}
}

// A task queued while the fleet was changing, for a label no worker turns out to be
// able to load, fails once the fleet has settled (at the next Rebalance) rather than
// wait out its deadline; so do queued tasks whose last possible worker left or stopped
// listing the label. Tasks some worker can load, and all tasks while no worker is
// connected, go on waiting.
func TestQueuedTaskForAnUnloadableLabelFailsOnceSettled(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: 10 * time.Second})
	failed := func() []string {
		t.Helper()
		var ids []string
		for _, f := range b.s.Rebalance().Failed {
			if f.Reason != FailNoWorkerCanLoad {
				t.Fatalf("task %s failed for %v", f.Task.ID, f.Reason)
			}
			ids = append(ids, f.Task.Label)
		}
		return ids
	}
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 2, Slots: 1, Loadable: []string{"X", "Z"}}); err != nil {
		t.Fatal(err)
	}
	one(t, b.submit(b.task("X"))) // w1 is busy from here on
	typo, z := b.task("typo"), b.task("Z")
	none(t, b.submit(typo)) // within FleetSettle: it waits
	none(t, b.submit(z))
	b.clock.advance(5 * time.Second)
	if got := failed(); len(got) != 0 {
		t.Fatalf("failed within FleetSettle: %v", got)
	}
	b.clock.advance(5 * time.Second)
	if got := failed(); len(got) != 1 || got[0] != "typo" || typo.Queued() || !z.Queued() {
		t.Fatalf("once settled, failed %v; want typo alone (z queued %v)", got, z.Queued())
	}
	check(t, b.s)

	if _, err := b.s.SetLoadable("w1", []string{"X"}); err != nil { // Z left the repository
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	if got := failed(); len(got) != 1 || got[0] != "Z" {
		t.Fatalf("after Z left the only backend that listed it: failed %v", got)
	}
	check(t, b.s)

	x := b.task("X")
	none(t, b.submit(x)) // waits for busy w1, which can load it
	if _, err := b.s.RemoveWorker("w1"); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	if got := failed(); len(got) != 0 || !x.Queued() {
		t.Fatalf("with no worker connected, failed %v; want every task waiting", got)
	}
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w2", MaxLabels: 1, Slots: 1, Loadable: []string{"Y"}}); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	if got := failed(); len(got) != 2 || got[0] != "X" || got[1] != "X" {
		t.Fatalf("with only w2 (Y) connected: failed %v, want both X tasks", got)
	}
	check(t, b.s)
}

// A label whose backend stopped listing it while a worker still held it keeps its
// queued tasks through the sweep; when that last copy goes, they fail at the next
// sweep rather than wait out their deadline (found by a review).
func TestQueuedTaskFailsWhenTheLastCopyOfAnUnlistedLabelGoes(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: 10 * time.Second})
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 2, Slots: 1, Labels: []string{"Z"}, Loadable: []string{"X", "Z"}}); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	one(t, b.submit(b.task("X"))) // w1 busy
	z := b.task("Z")
	none(t, b.submit(z))                                            // waits for its busy holder
	if _, err := b.s.SetLoadable("w1", []string{"X"}); err != nil { // Z left the repository
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	if f := b.s.Rebalance().Failed; len(f) != 0 || !z.Queued() {
		t.Fatalf("failed %d while w1 still holds Z; want it waiting", len(f))
	}
	b.s.LabelGone("w1", "Z") // unloaded: nobody holds or lists Z now
	if f := b.s.Rebalance().Failed; len(f) != 1 || f[0].Task != z || f[0].Reason != FailNoWorkerCanLoad {
		t.Fatalf("after the last copy went: failed %+v, want the queued Z task", f)
	}
	check(t, b.s)
}

// A worker leaving, with nobody joining, is enough to fail the tasks only it could
// load once the fleet settles.
func TestQueuedTaskFailsWhenItsOnlyLoaderLeaves(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FleetSettle: 10 * time.Second})
	for _, spec := range []WorkerSpec{{ID: "w1", MaxLabels: 1, Slots: 1, Loadable: []string{"X"}}, {ID: "w2", MaxLabels: 1, Slots: 1, Loadable: []string{"Y"}}} {
		if _, err := b.s.AddWorker(spec); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.advance(10 * time.Second)
	one(t, b.submit(b.task("X")))
	x := b.task("X")
	none(t, b.submit(x))
	if _, err := b.s.RemoveWorker("w1"); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(10 * time.Second)
	if f := b.s.Rebalance().Failed; len(f) != 2 || x.Queued() {
		t.Fatalf("after its only loader left: failed %d, want both X tasks (the running one requeued)", len(f))
	}
	check(t, b.s)
}

func TestUnavailableWorkerTakesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if _, err := b.s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 1, Slots: 1, Labels: []string{"a"}, Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	task := b.task("a")
	none(t, b.submit(task))
	out, _ := b.s.SetAccepting("w1", true)
	if len(out.Assigned) != 1 || out.Assigned[0].Task != task {
		t.Fatalf("worker back: got %+v", out.Assigned)
	}
}

// A refused attempt goes back to the front of the queue and may start elsewhere; after
// MaxAttempts refusals the task fails instead of bouncing for ever.
func TestRequeueRefusedAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxAttempts: 2})
	b.worker("w1", 1, 1, "a")
	task := b.task("a")
	one(t, b.submit(task))
	b.worker("w2", 1, 1, "a") // free holder, takes nothing yet
	b.s.SetAccepting("w1", false)
	out, err := b.s.Requeue("w1", task)
	if err != nil || len(out.Assigned) != 1 || out.Assigned[0].WorkerID != "w2" || task.Attempt != 2 {
		t.Fatalf("requeue: %+v %v attempt %d", out, err, task.Attempt)
	}
	out, _ = b.s.Requeue("w2", task)
	if len(out.Failed) != 1 || out.Failed[0].Reason != FailAttempts {
		t.Fatalf("second refusal with MaxAttempts 2: %+v", out)
	}
	if _, err := b.s.Requeue("w2", task); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("requeue of a finished task: %v", err)
	}
}

// The pass-over bound scales with the label's load time: a task for a label that takes
// long to load is passed over longer before a worker drops its own backlog for it.
func TestPassOverBoundScalesWithLoadTime(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxPassOver: time.Second, PassOverLoads: 10, LoadTimePrior: time.Second})
	b.worker("w1", 1, 1, "a")
	running := b.task("a")
	one(t, b.submit(running))
	starving := b.task("b")
	none(t, b.submit(starving))
	mine := b.task("a")
	none(t, b.submit(mine))
	b.clock.advance(5 * time.Second) // past MaxPassOver, within 10 loads of 1s
	if a := one(t, b.complete(running, false)); a.Task != mine {
		t.Fatalf("took %s, want the worker's own backlog (%s) within the bound", a.Task.ID, mine.ID)
	}
	b.clock.advance(5 * time.Second) // now 10 s: past the bound
	none(t, b.submit(b.task("a")))
	if a := one(t, b.complete(mine, false)); a.Task != starving {
		t.Fatalf("took %s, want the starving %s", a.Task.ID, starving.ID)
	}
}

// Eviction weighs what a label's loss costs: a label with tasks queued for it is kept
// while another can go, even when it is the least recently used.
func TestEvictionKeepsLabelWithQueuedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxPassOver: time.Second, PassOverLoads: 1})
	b.worker("w", 3, 2, "b", "a", "d") // b least recently used
	runningA := b.task("a")
	one(t, b.submit(runningA))
	b.worker("other", 1, 1, "z")
	busyZ := b.task("z")
	one(t, b.submit(busyZ))
	// Fill w's second slot too, so that tasks queue.
	runningA2 := b.task("a")
	one(t, b.submit(runningA2))
	aged := b.task("c") // nobody holds c and no worker is free: it waits
	none(t, b.submit(aged))
	queuedB := b.task("b")
	if as := b.submit(queuedB); len(as) != 0 { // w is full; b waits for it
		t.Fatalf("b task assigned: %+v", as)
	}
	b.clock.advance(2 * time.Second) // c is passed over too long now
	b.complete(runningA2, false)     // w frees one slot: the aged head c goes first
	v, _ := b.s.Worker("w")
	got := fmt.Sprint(v.Labels)
	if !strings.Contains(got, "b") || strings.Contains(got, "d") {
		t.Fatalf("w holds %s: want b (queued tasks) kept and d evicted", got)
	}
}

// The churn guard: a label loaded moments ago is not evicted at once when another can go.
func TestChurnGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LoadTimePrior: time.Second})
	b.worker("w", 2, 1, "q", "p") // least recently used first: q
	b.clock.advance(10 * time.Second)
	r := b.task("r")
	if a := one(t, b.submit(r)); a.EvictLabel != "q" { // q is least recently used
		t.Fatalf("first load evicted %q, want q", a.EvictLabel)
	}
	b.complete(r, true)
	p := b.task("p") // p is now more recently used than the fresh r
	one(t, b.submit(p))
	b.complete(p, false)
	b.clock.advance(500 * time.Millisecond) // r loaded 0.5 s ago: within 2 loads
	if a := one(t, b.submit(b.task("s"))); a.EvictLabel != "p" {
		t.Fatalf("evicted %q, want p: r was loaded moments ago", a.EvictLabel)
	}
}

// A copy of a label other workers also hold goes before a sole copy.
func TestEvictionPrefersReplica(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w", 2, 1, "sole", "shared") // sole is least recently used
	b.worker("other", 1, 1, "shared")
	hold := b.task("shared")
	one(t, b.submit(hold)) // keeps "other" busy so the next load lands on w
	b.clock.advance(time.Minute)
	if a := one(t, b.submit(b.task("new"))); a.WorkerID != "w" || a.EvictLabel != "shared" {
		t.Fatalf("got %+v, want w evicting its replica of shared", a)
	}
}

// The wait estimate uses the run time a holder has shown for the label and what is
// left of the task it runs: the same queue is worth waiting for near the end of the
// holder's task, and not at its start.
func TestWaitEstimateUsesHolderRunTimeAndRemaining(t *testing.T) {
	t.Parallel()
	run := func(elapsed time.Duration) Assignment {
		b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond})
		b.worker("holder", 1, 1, "m")
		b.worker("spare", 1, 1, "other")
		warm := b.task("m")
		one(t, b.submit(warm))
		// The holder runs m in 500ms: its own estimate (the label's moves to 140ms).
		if _, err := b.s.Complete("holder", warm, Observation{RunTime: 500 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		one(t, b.submit(b.task("m"))) // the holder is busy from now on
		b.clock.advance(elapsed)
		out := b.submit(b.task("m"))
		if len(out) == 0 {
			return Assignment{}
		}
		return out[0]
	}
	// At the start: wait 500ms rest + 500ms run = 1s > load 400 + margin 200 + run 140.
	if a := run(0); a.WorkerID != "spare" || !a.Load {
		t.Fatalf("at the start of the holder's task: %+v, want a load on spare", a)
	}
	// 400ms in: wait 100ms + 500ms = 600ms < 740ms: wait for the holder.
	if a := run(400 * time.Millisecond); a.Task != nil {
		t.Fatalf("near the end of the holder's task: assigned to %s, want it to wait", a.WorkerID)
	}
}

// tickingClock moves on a millisecond at every reading, so a call that read the clock
// more than once would show it.
type tickingClock struct {
	now   time.Time
	reads int
}

func (c *tickingClock) Now() time.Time {
	c.reads++
	c.now = c.now.Add(time.Millisecond)
	return c.now
}

// TestOneClockReadingPerCall: a scheduler call reads the clock once, and every step in
// it (enqueue, the load-or-wait estimate, eviction, start) sees that instant.
func TestOneClockReadingPerCall(t *testing.T) {
	clock := &tickingClock{now: time.Unix(1_700_000_000, 0)}
	s, err := New(Config{}, clock)
	if err != nil {
		t.Fatal(err)
	}
	once := func(what string, call func()) {
		t.Helper()
		before := clock.reads
		call()
		if n := clock.reads - before; n != 1 {
			t.Fatalf("%s read the clock %d times, want 1", what, n)
		}
	}
	submit := func(tk *Task) *Outcome {
		t.Helper()
		var out *Outcome
		once("Submit "+tk.ID, func() {
			var err error
			if out, err = s.Submit(tk); err != nil {
				t.Fatal(err)
			}
		})
		return out
	}
	once("AddWorker", func() { s.AddWorker(WorkerSpec{ID: "w1", MaxLabels: 1, Slots: 1, Labels: []string{"a"}}) })
	once("AddWorker", func() { s.AddWorker(WorkerSpec{ID: "w2", MaxLabels: 1, Slots: 1, Labels: []string{"b"}}) })
	t1 := &Task{ID: "t1", Label: "a"}
	submit(t1)
	if t1.WorkerID() != "w1" || !t1.Started.Equal(t1.Enqueued) {
		t.Fatalf("t1 on %q started %v, enqueued %v: want w1 at the same instant", t1.WorkerID(), t1.Started, t1.Enqueued)
	}
	// w1 is busy: t2 weighs waiting for it against loading a on w2, evicting b.
	t2 := &Task{ID: "t2", Label: "a"}
	submit(t2)
	t3 := &Task{ID: "t3", Label: "c"}
	submit(t3)
	for _, tk := range []*Task{t1, t2, t3} {
		if tk.Running() {
			once("Complete "+tk.ID, func() {
				if _, err := s.Complete(tk.WorkerID(), tk, Observation{RunTime: time.Millisecond}); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
	once("Expire", func() { s.Expire() })
	once("Rebalance", func() { s.Rebalance() })
}

// A task out of attempts whose deadline has passed fails as late (504), not as lost:
// its producer is told it ran out of time, which it did, whichever came first.
func TestLastAttemptPastItsDeadlineFailsAsLate(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"lost", "refused"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{MaxAttempts: 1})
			b.worker("w1", 1, 1, "a")
			task := b.task("a")
			task.Deadline = b.clock.now.Add(time.Second)
			one(t, b.submit(task))
			b.clock.advance(2 * time.Second) // the deadline passes while it runs
			var out *Outcome
			var err error
			if how == "lost" {
				out, err = b.s.RemoveWorker("w1")
			} else {
				out, err = b.s.Requeue("w1", task)
			}
			if err != nil || len(out.Failed) != 1 || out.Failed[0].Reason != FailDeadline {
				t.Fatalf("%s on its last attempt after its deadline: %+v %v, want FailDeadline", how, out, err)
			}
		})
	}
}

// An attempt its worker overran by the grace fails with FailOverrun, naming the
// worker, and leaves the scheduler; its slot stays busy until the worker's late
// result, which frees it and starts the next task.
func TestExpireRunningKeepsTheSlotUntilTheLateResult(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 2, 1, "a")
	hung := b.task("a")
	hung.Deadline = b.clock.now.Add(time.Second)
	one(t, b.submit(hung))
	next := b.task("a")
	none(t, b.submit(next))

	b.clock.advance(time.Second + 4*time.Second)
	if out := b.s.ExpireRunning(5 * time.Second); len(out.Failed) != 0 {
		t.Fatalf("failed before the grace was over: %+v", out.Failed)
	}
	b.clock.advance(time.Second)
	out := b.s.ExpireRunning(5 * time.Second)
	if len(out.Failed) != 1 || out.Failed[0].Task != hung || out.Failed[0].Reason != FailOverrun || out.Failed[0].WorkerID != "w1" {
		t.Fatalf("want hung failed with FailOverrun on w1, got %+v", out.Failed)
	}
	none(t, out.Assigned)
	if hung.Running() || hung.WorkerID() != "" {
		t.Fatal("the overrun task is still the scheduler's")
	}
	if v, _ := b.s.Worker("w1"); v.Running != 1 {
		t.Fatalf("w1 runs %d, want its overrun slot still busy", v.Running)
	}
	if !next.Queued() {
		t.Fatal("the next task started on the overrun slot")
	}
	if _, err := b.s.Complete("w1", hung, Observation{}); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("Complete of the answered task: %v, want ErrUnknownTask", err)
	}
	if _, ok := b.s.EndOverrun("w1", hung.ID, hung.Attempt+1, Observation{}); ok {
		t.Fatal("a result of another attempt ended the overrun")
	}
	end, ok := b.s.EndOverrun("w1", hung.ID, hung.Attempt, Observation{Failed: true})
	if !ok {
		t.Fatal("the late result did not end the overrun")
	}
	if a := one(t, end.Assigned); a.Task != next {
		t.Fatalf("the freed slot took %s, want %s", a.Task.ID, next.ID)
	}
	if _, ok := b.s.EndOverrun("w1", hung.ID, hung.Attempt, Observation{}); ok {
		t.Fatal("a second late result ended the overrun again")
	}
}

// A worker that leaves with an overrun attempt: the answered task is not requeued.
func TestRemovedWorkerDoesNotRequeueAnOverrunTask(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 2, 1, "a")
	hung := b.task("a")
	hung.Deadline = b.clock.now.Add(time.Second)
	one(t, b.submit(hung))
	b.clock.advance(10 * time.Second)
	if out := b.s.ExpireRunning(5 * time.Second); len(out.Failed) != 1 {
		t.Fatalf("want the attempt overrun, got %+v", out.Failed)
	}
	b.worker("w2", 2, 1, "a")
	out, err := b.s.RemoveWorker("w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Assigned) != 0 || len(out.Failed) != 0 || b.s.QueuedTasks() != 0 {
		t.Fatalf("the overrun task came back: assigned %+v, failed %+v, queued %d", out.Assigned, out.Failed, b.s.QueuedTasks())
	}
}

// A new run of a task id whose overrun attempt still holds a slot numbers its attempts
// after that attempt's, so the worker does not take the new one for a duplicate and
// the old one's late result does not end it; MaxAttempts still counts the new run's
// own starts. Once the last stand-in of the id is gone, numbering starts at 1 again.
func TestResubmissionNumbersAttemptsAfterAnOverrunOne(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxAttempts: 2})
	b.worker("w1", 1, 2, "a")
	hung := &Task{ID: "x", Label: "a", Deadline: b.clock.now.Add(time.Second)}
	one(t, b.submit(hung))
	b.clock.advance(10 * time.Second)
	if out := b.s.ExpireRunning(5 * time.Second); len(out.Failed) != 1 {
		t.Fatalf("want x overrun, got %+v", out.Failed)
	}

	again := &Task{ID: "x", Label: "a"}
	a := one(t, b.submit(again)) // the other slot of w1
	if a.WorkerID != "w1" || again.Attempt != 1 || again.AttemptNumber() != 2 {
		t.Fatalf("new run on %s as start %d numbered %d, want w1, start 1, numbered 2 (after the overrun attempt 1)",
			a.WorkerID, again.Attempt, again.AttemptNumber())
	}
	check(t, b.s)
	// Refused twice: two starts of the new run use up MaxAttempts 2, though the second
	// is numbered 3.
	if _, err := b.s.Requeue("w1", again); err != nil {
		t.Fatal(err)
	}
	if a := one(t, b.s.Rebalance().Assigned); a.Task != again || again.Attempt != 2 || again.AttemptNumber() != 3 {
		t.Fatalf("restarted as %+v, start %d numbered %d; want start 2 numbered 3", a, again.Attempt, again.AttemptNumber())
	}
	out, err := b.s.Requeue("w1", again)
	if err != nil || len(out.Failed) != 1 || out.Failed[0].Reason != FailAttempts {
		t.Fatalf("second refusal: %+v %v, want FailAttempts after the new run's 2 starts", out, err)
	}

	if _, ok := b.s.EndOverrun("w1", "x", 2, Observation{}); ok {
		t.Fatal("a result numbered 2 (the new run's) ended the overrun attempt 1")
	}
	if _, ok := b.s.EndOverrun("w1", "x", 1, Observation{}); !ok {
		t.Fatal("the overrun attempt's late result did not end it")
	}
	third := &Task{ID: "x", Label: "a"}
	one(t, b.submit(third))
	if third.AttemptNumber() != 1 {
		t.Fatalf("with no overrun attempt of x held, a new run is numbered %d, want 1", third.AttemptNumber())
	}
	check(t, b.s)
}

// A stand-in that goes with its worker no longer moves the numbering of the id.
func TestRemovedWorkerEndsAnOverrunAttemptsNumbering(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 1, "a")
	one(t, b.submit(&Task{ID: "x", Label: "a", Deadline: b.clock.now.Add(time.Second)}))
	b.clock.advance(10 * time.Second)
	b.s.ExpireRunning(5 * time.Second)
	if _, err := b.s.RemoveWorker("w1"); err != nil {
		t.Fatal(err)
	}
	b.worker("w2", 1, 1, "a")
	again := &Task{ID: "x", Label: "a"}
	one(t, b.submit(again))
	if again.AttemptNumber() != 1 {
		t.Fatalf("new run numbered %d after the overrun attempt's worker left, want 1", again.AttemptNumber())
	}
	check(t, b.s)
}

// An overrun attempt's late result is a run like any other: its worker's slot was busy
// with the label for that long. Its run time counts, so that a holder whose runs can
// take a minute no longer looks about to free up: the next task for the label loads on
// an idle worker rather than wait behind such a run.
func TestLateResultOfAnOverrunAttemptTeachesItsRunTime(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w1", 1, 1, "a")
	hung := &Task{ID: "x", Label: "a", Deadline: b.clock.now.Add(time.Second)}
	one(t, b.submit(hung))
	long := b.task("a")
	none(t, b.submit(long)) // queued behind the overrun slot
	b.clock.advance(time.Minute)
	if out := b.s.ExpireRunning(5 * time.Second); len(out.Failed) != 1 {
		t.Fatalf("want x overrun, got %+v", out.Failed)
	}
	end, ok := b.s.EndOverrun("w1", "x", 1, Observation{RunTime: time.Minute})
	if !ok {
		t.Fatal("the late result did not end the overrun")
	}
	if a := one(t, end.Assigned); a.Task != long {
		t.Fatalf("the freed slot took %s, want %s", a.Task.ID, long.ID)
	}
	b.worker("w2", 1, 1)
	probe := b.task("a")
	if a := one(t, b.submit(probe)); a.WorkerID != "w2" || !a.Load {
		t.Fatalf("probe went to %s (load %v), want a load on the idle w2 rather than a wait behind a run like the minute-long one", a.WorkerID, a.Load)
	}
	check(t, b.s)
}

// An assignment the owner withdraws instead of sending leaves the worker's view as the
// worker has it: the label it was to load is not held, the label it named for eviction
// is, and the start is not counted. The freed slot takes a queued task in the next
// call, with no load: the worker holds its label.
func TestWithdrawnAssignmentLeavesTheWorkersViewAsBefore(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w", 1, 1, "n")
	tm := b.task("m")
	a := one(t, b.submit(tm))
	if !a.Load || a.EvictLabel != "n" {
		t.Fatalf("got %+v, want m loading with n evicted", a)
	}
	tn := b.task("n")
	none(t, b.submit(tn)) // w's one slot is taken

	if !b.s.Withdraw(a) {
		t.Fatal("Withdraw of a running assignment reported false")
	}
	if tm.Running() || tm.Queued() || tm.Attempt != 0 {
		t.Fatalf("withdrawn task: running %v, queued %v, %d starts; want it done, never started", tm.Running(), tm.Queued(), tm.Attempt)
	}
	if v, _ := b.s.Worker("w"); v.Running != 0 || !slices.Equal(v.Labels, []string{"n"}) {
		t.Fatalf("w's view %+v, want [n] and nothing running: it never heard of m", v)
	}
	w := b.s.workers["w"]
	if len(w.loadsAsked) != 0 || len(w.evictsAsked) != 0 {
		t.Fatalf("loads asked %v, evictions asked %v; want none: the assignment was not sent", w.loadsAsked, w.evictsAsked)
	}
	check(t, b.s)
	if b.s.Withdraw(a) {
		t.Fatal("a second Withdraw of the same assignment reported true")
	}
	if a := one(t, b.s.Expire().Assigned); a.Task != tn || a.Load || a.EvictLabel != "" {
		t.Fatalf("the freed slot took %+v, want %s on the n w holds", a, tn.ID)
	}
	check(t, b.s)
}

// A withdrawn assignment that joined a copy another assignment is loading leaves that
// load alone: the assignment that asked for it was sent.
func TestWithdrawnAssignmentKeepsALoadItJoined(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w", 2, 2)
	if a := one(t, b.submit(b.task("m"))); !a.Load {
		t.Fatalf("got %+v, want a load of m", a)
	}
	joined := one(t, b.submit(b.task("m")))
	if joined.Load {
		t.Fatalf("got %+v, want the second task to join the pending load", joined)
	}
	if !b.s.Withdraw(joined) {
		t.Fatal("Withdraw reported false")
	}
	w := b.s.workers["w"]
	if i := w.find("m"); i < 0 || w.held[i].doomed || !w.held[i].pending {
		t.Fatal("the pending copy of m was dropped or doomed with the withdrawn assignment that joined it")
	}
	if _, asked := w.loadsAsked["m"]; !asked {
		t.Fatal("the load of m is no longer counted as asked")
	}
	check(t, b.s)
}

// Rule 6 at submission: a task whose deadline has already passed (the owner set it
// before a slow journal write) fails with FailDeadline, with no load or eviction.
func TestSubmitFailsTaskWhoseDeadlineHasPassed(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w", 2, 1, "a")
	for _, late := range []time.Duration{time.Millisecond, 0} {
		tk := b.task("b")
		tk.Deadline = b.clock.now.Add(-late)
		out, err := b.s.Submit(tk)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Assigned) != 0 || len(out.Failed) != 1 || out.Failed[0].Task != tk || out.Failed[0].Reason != FailDeadline {
			t.Fatalf("deadline %v ago: assigned %+v, failed %+v; want it failed with FailDeadline", late, out.Assigned, out.Failed)
		}
	}
	tk := b.task("b")
	tk.Deadline = b.clock.now.Add(time.Millisecond)
	if a := one(t, b.submit(tk)); a.Task != tk || !a.Load {
		t.Fatalf("got %+v, want the task with a deadline ahead loading b", a)
	}
	check(t, b.s)
}

// Rule 7: a lost worker's tasks go back to the front of the queue oldest first, however
// completions have reordered the worker's running tasks.
func TestRemoveWorkerRequeuesInSubmissionOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w", 1, 3, "a")
	t1, t2, t3 := b.task("a"), b.task("a"), b.task("a")
	one(t, b.submit(t1))
	one(t, b.submit(t2))
	one(t, b.submit(t3))
	b.complete(t1, false) // t3 takes t1's place among the running
	t4 := b.task("a")
	one(t, b.submit(t4))
	queued := b.task("a")
	none(t, b.submit(queued))
	if _, err := b.s.RemoveWorker("w"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for q := b.s.queue.head; q != nil; q = q.global.next {
		got = append(got, q.ID)
	}
	if want := []string{t2.ID, t3.ID, t4.ID, queued.ID}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	check(t, b.s)
}

// A copy whose load is under way is not evicted, even once the attempt that asked for
// it has ended: the agent finishes the load and evicts only loaded labels. Once it
// reports the label loaded, the copy may go like any other.
func TestLoadingCopyNotEvictedUntilLoaded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.worker("w", 1, 1)
	first := b.task("a")
	if a := one(t, b.submit(first)); !a.Load {
		t.Fatalf("want a load, got %+v", a)
	}
	b.s.LabelLoading("w", "a")
	// The attempt ends (its deadline passed) while the load goes on.
	if _, err := b.s.Complete("w", first, Observation{Failed: true}); err != nil {
		t.Fatal(err)
	}
	other := b.task("b")
	none(t, b.submit(other)) // not with "a" named for eviction while it loads
	as := b.s.LabelLoaded("w", "a").Assigned
	if len(as) != 1 || as[0].Task != other || as[0].EvictLabel != "a" {
		t.Fatalf("got %+v, want %s loading b evicting a once a is loaded", as, other.ID)
	}
	check(t, b.s)
}
