// Package scheduler decides which worker runs which task. It is pure: no sockets, no
// HTTP, no goroutines, no wall clock of its own. The dispatcher and the simulator drive
// the very same code, so what the simulator measures is what production does.
//
// A Scheduler is not safe for concurrent use: its owner (the dispatcher's hub, under
// one mutex, or the simulator's event loop) serialises every call. Each mutating call
// returns an Outcome describing the assignments to send and the tasks that failed; the
// Outcome's slices are reused by the next call, so consume them before calling again.
//
// Cost stays flat as the fleet grows: a task for a label goes to a member of that
// label's idle-holder set, a load goes to a member of the free-worker sets, and a
// worker that frees up looks only at the queues of the few labels it holds, at a
// bounded prefix of the global queue, and at the labels nobody serves (usually none).
// Nothing scans every worker; only a worker behind more queued tasks than that prefix
// that it cannot take looks at the queues of the labels its backend lists.
package scheduler

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Clock is the scheduler's only source of time.
type Clock interface{ Now() time.Time }

// Policy names a routing policy.
type Policy string

const (
	// PolicyAffinity routes to idle holders of the label, queues per label, and
	// weighs waiting for a busy holder against loading the label elsewhere.
	PolicyAffinity Policy = "affinity"
	// PolicyRandom is the baseline: one common FIFO queue, any free worker, chosen at
	// random, loads whatever label the task needs.
	PolicyRandom Policy = "random"
)

// Config tunes a Scheduler. The zero value of each field means its documented default.
type Config struct {
	// Policy chooses the routing policy. Zero means PolicyAffinity.
	Policy Policy
	// MaxAttempts bounds how many times a task is started before it fails because its
	// workers kept disappearing. Zero means 3.
	MaxAttempts int
	// MaxPassOver and PassOverLoads bound how long a queued task may be passed over by
	// workers that prefer tasks for labels they hold: the larger of MaxPassOver and
	// PassOverLoads times the learned load time of the task's label. Scaling with the
	// load keeps the bound from turning an overloaded queue into FIFO, where every
	// freed worker loads for one old task instead of serving a backlog it holds.
	// Zero means 2s and 100.
	MaxPassOver   time.Duration
	PassOverLoads float64
	// LoadTimePrior and RunTimePrior are the estimates used for a label before any
	// observation. Zero means 400ms and 50ms (the seed's figures).
	LoadTimePrior time.Duration
	RunTimePrior  time.Duration
	// MaxDelaySlack caps the delay slack (see observeDelay): a result later than this
	// for reasons outside its task counts as this late. The slack lets a holder overrun
	// its estimate, and a queued task wait, by that much before either counts against
	// waiting; one long network stall, uncapped, let every stuck holder pass for
	// stalled for minutes. The cap is the longest stall the scheduler waits out: the
	// longest traced on a busy host (2 s; most were 30 ms to 700 ms), so that none of
	// those reads as a stuck holder. Zero means 2s.
	MaxDelaySlack time.Duration
	// LabelFailureThreshold load failures of one label within LabelFailureWindow mark
	// the label failing for LabelFailureCooldown: its tasks fail at once instead of
	// loading on worker after worker. Zero means 3, 1m and 30s.
	LabelFailureThreshold int
	LabelFailureWindow    time.Duration
	LabelFailureCooldown  time.Duration
	// FleetSettle is how long the set of connected workers must stay unchanged before a
	// task whose label none of them can load fails at once (FailNoWorkerCanLoad): while
	// workers come and go (a dispatcher restart, a rollout), the one that can load it
	// may be about to connect. Zero means 30s.
	FleetSettle time.Duration
	// ForgottenLabels bounds how many labels that no worker holds and no task waits for
	// keep their learned load and run times, the least recently forgotten dropped first
	// (the rest of such a label's state goes, so that a stream of one-off labels cannot
	// grow the scheduler): a label evicted everywhere that returns is weighed by its own
	// durations rather than the priors. About 100 bytes and the name each. Zero means
	// 4096; negative keeps none.
	ForgottenLabels int
	// Seed makes random choices reproducible.
	Seed uint64
}

// WithDefaults returns the config with zero fields replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.Policy == "" {
		c.Policy = PolicyAffinity
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.MaxPassOver == 0 {
		c.MaxPassOver = 2 * time.Second
	}
	if c.PassOverLoads == 0 {
		c.PassOverLoads = 100
	}
	if c.LoadTimePrior == 0 {
		c.LoadTimePrior = 400 * time.Millisecond
	}
	if c.RunTimePrior == 0 {
		c.RunTimePrior = 50 * time.Millisecond
	}
	if c.MaxDelaySlack == 0 {
		c.MaxDelaySlack = 2 * time.Second
	}
	if c.LabelFailureThreshold == 0 {
		c.LabelFailureThreshold = 3
	}
	if c.LabelFailureWindow == 0 {
		c.LabelFailureWindow = time.Minute
	}
	if c.LabelFailureCooldown == 0 {
		c.LabelFailureCooldown = 30 * time.Second
	}
	if c.FleetSettle == 0 {
		c.FleetSettle = 30 * time.Second
	}
	if c.ForgottenLabels == 0 {
		c.ForgottenLabels = 4096
	}
	return c
}

func (c Config) validate() error {
	switch c.Policy {
	case PolicyAffinity, PolicyRandom:
	default:
		return fmt.Errorf("scheduler: Policy %q unknown (want %q or %q)", c.Policy, PolicyAffinity, PolicyRandom)
	}
	if c.MaxAttempts < 1 {
		return fmt.Errorf("scheduler: MaxAttempts must be at least 1, got %d", c.MaxAttempts)
	}
	if c.MaxPassOver < 0 || c.PassOverLoads < 0 || c.LoadTimePrior < 0 || c.RunTimePrior < 0 || c.MaxDelaySlack < 0 {
		return errors.New("scheduler: MaxPassOver, PassOverLoads, LoadTimePrior, RunTimePrior and MaxDelaySlack must not be negative")
	}
	if err := CheckPassOverLoads(c.PassOverLoads, c.LoadTimePrior); err != nil {
		return fmt.Errorf("scheduler: PassOverLoads: %w", err)
	}
	if c.FleetSettle < 0 {
		return errors.New("scheduler: FleetSettle must not be negative")
	}
	if c.LabelFailureThreshold < 1 || c.LabelFailureWindow < 0 || c.LabelFailureCooldown < 0 {
		return fmt.Errorf("scheduler: LabelFailureThreshold must be at least 1 (got %d) and LabelFailureWindow, LabelFailureCooldown not negative",
			c.LabelFailureThreshold)
	}
	return nil
}

// MaxLoadTime is the longest load time the pass-over bound is sized for: the
// dispatcher takes no longer load time from a worker (a day, as a task's deadline).
// The bound is still computed without overflow past it (passedOverTooLong).
const MaxLoadTime = 24 * time.Hour

// CheckPassOverLoads refuses a pass-over bound, in loads (Config.PassOverLoads), that
// is not a finite number or whose product with a load time (up to the larger of
// loadTimePrior and MaxLoadTime) overflows a time.Duration: the bound would wrap and
// fall to MaxPassOver instead of meaning what it says. Negative values are validate's
// to refuse.
func CheckPassOverLoads(loads float64, loadTimePrior time.Duration) error {
	if math.IsNaN(loads) || math.IsInf(loads, 0) {
		return fmt.Errorf("must be a finite number, got %v", loads)
	}
	load := max(loadTimePrior, MaxLoadTime)
	if limit := float64(math.MaxInt64) / float64(load); loads >= limit {
		return fmt.Errorf("%v loads of %v overflow a duration (about 292 years); at most %.0f", loads, load, math.Floor(limit))
	}
	return nil
}

// FailReason says why the scheduler gave up on a task.
type FailReason int

const (
	// FailDeadline: the task's deadline passed while it was queued, before it was
	// submitted, or before its last attempt was lost or refused.
	FailDeadline FailReason = iota + 1
	// FailAttempts: the task's workers were lost, or refused it, MaxAttempts times.
	FailAttempts
	// FailLoad: the task's label failed to load on the last worker it was allowed,
	// and it had used up MaxAttempts, or on every connected worker that could take it.
	FailLoad
	// FailLabelFailing: the task's label is marked failing (see LabelFailureThreshold).
	FailLabelFailing
	// FailNoWorkerCanLoad: workers are connected, and none of them can load the
	// task's label (their backends list what they can load, and it is not there).
	FailNoWorkerCanLoad
	// FailOverrun: the task's worker ran it past its deadline by the grace given to
	// ExpireRunning and has not answered.
	FailOverrun
)

func (r FailReason) String() string {
	switch r {
	case FailDeadline:
		return "deadline exceeded while queued"
	case FailAttempts:
		return "workers lost or refused the task too many times"
	case FailLoad:
		return "label failed to load on every worker tried"
	case FailLabelFailing:
		return "label is failing to load"
	case FailNoWorkerCanLoad:
		return "no connected worker can load the label"
	case FailOverrun:
		return "worker overran the deadline and did not answer"
	}
	return "unknown"
}

// Assignment tells the owner to send Task to WorkerID.
type Assignment struct {
	Task     *Task
	WorkerID string
	// EvictLabel is the label the worker must unload first; empty when none.
	EvictLabel string
	// Load is true when the worker does not hold the label yet.
	Load bool
	// Reason says why the label is loaded there, with Load: what the owner logs, so
	// that a run with more misses than expected can be read decision by decision.
	Reason LoadReason
}

// LoadReason says which rule made an assignment load its label.
type LoadReason uint8

const (
	// LoadNoHolder: no worker that can serve the label holds it.
	LoadNoHolder LoadReason = iota + 1
	// LoadBeatsWait: the holders are busy, and loading is expected to finish the task
	// sooner than waiting for one by half a load (rule 2).
	LoadBeatsWait
	// LoadOutpaced: the label's tasks come faster than its holders run them.
	LoadOutpaced
	// LoadOverdue: the task has waited longer than a load would have taken, and no
	// holder is expected to take it within half a load.
	LoadOverdue
	// LoadPassedOver: the task has waited past its pass-over bound (rule 4).
	LoadPassedOver
	// LoadReserved: the worker freed a label for the task, which had waited past its
	// bound.
	LoadReserved
	// LoadRandom: the random policy loads whatever label its task needs.
	LoadRandom
)

func (r LoadReason) String() string {
	switch r {
	case LoadNoHolder:
		return "no holder"
	case LoadBeatsWait:
		return "load beats wait"
	case LoadOutpaced:
		return "holders outpaced"
	case LoadOverdue:
		return "overdue"
	case LoadPassedOver:
		return "passed over"
	case LoadReserved:
		return "reserved"
	case LoadRandom:
		return "random"
	}
	return "none"
}

// Failure tells the owner that Task is finished without running.
type Failure struct {
	Task   *Task
	Reason FailReason
	// LoadError is the last load error of the task's label, for FailLoad and
	// FailLabelFailing.
	LoadError string
	// WorkerID is the worker that overran the task, for FailOverrun.
	WorkerID string
}

// Outcome is what a call decided. Its slices are reused by the next call.
type Outcome struct {
	Assigned []Assignment
	Failed   []Failure
}

// Errors returned for calls that name things the scheduler does not know.
var (
	ErrUnknownWorker = errors.New("scheduler: unknown worker")
	ErrDuplicate     = errors.New("scheduler: worker already registered")
	ErrUnknownTask   = errors.New("scheduler: task not running on that worker")
	ErrTaskInUse     = errors.New("scheduler: task already submitted")
)

// Scheduler is the routing state: workers, the labels they hold, queued tasks.
type Scheduler struct {
	cfg   Config
	clock Clock
	rng   *rand.Rand

	workers map[string]*worker
	labels  map[string]*labelState
	// free holds accepting workers with a free slot; roomy is its subset that also
	// has room for another label without evicting.
	free  workerSet
	roomy workerSet

	// queue is every queued task in arrival order (the common FIFO in random mode).
	queue    taskList
	queued   int
	nextSeq  uint64
	useTick  uint64
	deadline deadlineHeap
	// runningDeadline holds the running attempts that have a deadline, so that
	// ExpireRunning finds the overrun ones without walking every worker.
	runningDeadline deadlineHeap
	// overrunHeld has an entry per task id whose overrun attempts still hold slots
	// (stand-ins; see ExpireRunning): Submit numbers a new run of the id after them.
	// ExpireRunning adds to it, EndOverrun and RemoveWorker take away; it is empty
	// unless workers hang.
	overrunHeld map[string]overrunAttempts

	out Outcome
	// now is the clock reading of the call in progress, taken once by reset: every
	// decision in one call sees the same instant, and a task's path through the
	// scheduler reads the clock twice (Submit, Complete) rather than at every step.
	now time.Time

	// delay and delayAt are the largest delay seen outside an attempt's task (see
	// observeDelay) and when it was seen; slack is that delay decayed to now, computed
	// once per call (slackOK) when first needed: remaining, which needs it, is a hot
	// path, and a call that places a task on an idle holder needs it not at all.
	delay   time.Duration
	delayAt time.Time
	slack   time.Duration
	slackOK bool

	// failing tracks labels whose loads failed recently (see labelhealth.go).
	failing map[string]*labelFailures
	// forgotten keeps the learned estimates of labels whose state maybeForget dropped.
	forgotten forgotten

	// anyLabel counts the workers that can load any label; loadableBy counts, per
	// label, the other workers whose backends list it. Submit fails a task no
	// connected worker can ever take rather than hold it until its deadline.
	anyLabel   int
	loadableBy map[string]int
	// fleetChanged is when a worker last connected or left, or changed what it can
	// load (see FleetSettle).
	fleetChanged time.Time
	// sweepUnloadable: tasks may be queued for a label no connected worker can load
	// (queued while the fleet was changing, or left so by a worker leaving or its
	// backend's list shrinking). Rebalance fails them once the fleet has settled.
	sweepUnloadable bool
	// excludedQueued are tasks requeued after a failed load. The sweep fails those that
	// failed on every connected worker that could take them (FailLoad); entries of tasks
	// no longer queued are dropped then.
	excludedQueued []excludedTask

	// Recycled records: labels come and go with every load on a large label set, and
	// reusing their records keeps the load path free of allocations.
	spareLabels []*labelState
	spareHeld   []*heldLabel

	// offerPos is where the next offerFree starts in the free set, so that successive
	// calls visit every free worker in turn rather than the same last few.
	offerPos int
	offerBuf []*worker
	// agedBuf is agedBehind's scratch list, kept to spare the allocation.
	agedBuf []*Task
	// unserved are the labels with tasks queued and no active holder, in no order (see
	// noteServed): a free worker that can load one should (rule 2), and pick finds them
	// here when its scan of the queue, a bounded stretch, did not reach them.
	unserved []*labelState

	// wakeWorkers are workers whose reservation went with its task (the task left the
	// queue) or whose slot a withdrawn assignment freed, and wakeLabels labels whose
	// queued tasks lost their last active holder (evicted, doomed, gone), during the
	// call in progress or a call that returns no Outcome (Cancel, Abandon, Withdraw).
	// settle, at the end of the next call that returns one, fills the workers and
	// offers each label's oldest tasks for a load: without it they waited for a
	// Rebalance to reach them, which visits only rebalanceTries free workers per call.
	wakeWorkers []*worker
	wakeLabels  []string
}

// New returns a Scheduler. It fails only for an invalid config.
func New(cfg Config, clock Clock) (*Scheduler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, errors.New("scheduler: a Clock is required")
	}
	return &Scheduler{
		cfg:     cfg,
		clock:   clock,
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		workers: make(map[string]*worker),
		labels:  make(map[string]*labelState),
		failing: make(map[string]*labelFailures),
		queue:   taskList{on: globalLinks},

		forgotten: newForgotten(cfg.ForgottenLabels),

		loadableBy:  make(map[string]int),
		overrunHeld: make(map[string]overrunAttempts),
	}, nil
}

// Config returns the effective configuration.
func (s *Scheduler) Config() Config { return s.cfg }

// reset starts a mutating call: it empties the outcome and reads the clock.
func (s *Scheduler) reset() *Outcome {
	s.now = s.clock.Now()
	s.slackOK = false
	s.out.Assigned = s.out.Assigned[:0]
	s.out.Failed = s.out.Failed[:0]
	return &s.out
}

// expireDue fails the queued tasks whose deadline has passed. fill calls it too, so
// that no worker is given one (with a load, perhaps an eviction) in the time until the
// owner's next Expire; only calls that return their Outcome reach fill.
func (s *Scheduler) expireDue() {
	for len(s.deadline) > 0 && !s.deadline[0].Deadline.After(s.now) {
		t := s.deadline[0]
		s.unqueue(t)
		t.state = stateDone
		s.out.Failed = append(s.out.Failed, Failure{Task: t, Reason: FailDeadline})
	}
}

// failSpent fails a task that was lost or refused on its last attempt: as late when
// its deadline has passed (the producer ran out of time, whatever else happened), else
// as out of attempts.
func (s *Scheduler) failSpent(t *Task) {
	t.state = stateDone
	reason := FailAttempts
	if !t.Deadline.IsZero() && !t.Deadline.After(s.now) {
		reason = FailDeadline
	}
	s.out.Failed = append(s.out.Failed, Failure{Task: t, Reason: reason})
}

// WorkerSpec describes a worker as its hello announced it.
type WorkerSpec struct {
	ID string
	// MaxLabels is how many labels it holds at once; at least 1.
	MaxLabels int
	// Slots is how many tasks it runs at once; at least 1.
	Slots int
	// Labels it holds now, least recently used first. Extras beyond MaxLabels are
	// ignored (the least recent ones).
	Labels []string
	// Unavailable workers are known but take no tasks until SetAccepting(true).
	Unavailable bool
	// Loadable lists the labels the worker's backend can load; empty means any.
	Loadable []string
}

// AddWorker registers a worker; it may take queued tasks at once.
func (s *Scheduler) AddWorker(spec WorkerSpec) (*Outcome, error) {
	out := s.reset()
	if spec.ID == "" || spec.MaxLabels < 1 || spec.Slots < 1 {
		return out, fmt.Errorf("scheduler: worker %q needs an id, MaxLabels >= 1 and Slots >= 1", spec.ID)
	}
	if _, ok := s.workers[spec.ID]; ok {
		return out, fmt.Errorf("%w: %s", ErrDuplicate, spec.ID)
	}
	w := &worker{id: spec.ID, capacity: spec.MaxLabels, slots: spec.Slots, accepting: !spec.Unavailable,
		freePos: -1, roomyPos: -1}
	w.loadable = loadableSet(spec.Loadable)
	s.workers[spec.ID] = w
	s.countLoadable(w, 1)
	s.fleetChanged = s.now // a worker joining only adds labels: nothing for the sweep
	labels := spec.Labels
	if len(labels) > w.capacity {
		labels = labels[len(labels)-w.capacity:]
	}
	seen := make(map[string]struct{}, len(labels)) // w.find per label would be quadratic
	for _, l := range labels {
		if _, dup := seen[l]; !dup {
			seen[l] = struct{}{}
			s.addHeld(w, l, false)
		}
	}
	s.refreshFree(w)
	s.fill(w)
	return s.settle(out), nil
}

// RemoveWorker forgets a worker. Its running tasks go back to the front of the queue
// (or fail, after MaxAttempts) and may be assigned to other workers at once.
func (s *Scheduler) RemoveWorker(id string) (*Outcome, error) {
	out := s.reset()
	w, ok := s.workers[id]
	if !ok {
		return out, fmt.Errorf("%w: %s", ErrUnknownWorker, id)
	}
	s.setAccepting(w, false)
	for len(w.held) > 0 {
		s.dropHeld(w, len(w.held)-1)
	}
	delete(s.workers, id)
	s.countLoadable(w, -1)
	s.fleetChanged = s.now
	s.sweepUnloadable = true
	lost := w.running
	w.running = nil
	// Requeue newest first so that, pushed to the front one by one, the oldest ends
	// first. w.running is not in submission order (unrun swaps the last task into the
	// slot it frees), so sort it first.
	slices.SortFunc(lost, func(a, b *Task) int { return cmp.Compare(a.seq, b.seq) })
	for i := len(lost) - 1; i >= 0; i-- {
		t := lost[i]
		t.worker = nil
		s.unwatchDeadline(t)
		if t.state == stateOverran { // answered already: only its slot was held
			t.state = stateDone
			s.unholdOverrun(t.ID)
			continue
		}
		if t.Attempt >= s.cfg.MaxAttempts {
			s.failSpent(t)
			continue
		}
		s.enqueue(t, true)
	}
	// A task whose deadline passed while it ran fails here rather than start again.
	s.expireDue()
	// Free workers had nothing queued they wanted; the requeued tasks, and tasks that
	// waited for this worker's labels, may suit them now.
	for _, t := range lost {
		if t.state == stateQueued {
			s.place(t)
		}
	}
	s.offerFree()
	return s.settle(out), nil
}

// SetAccepting marks a worker as taking tasks or not (draining, backend down).
func (s *Scheduler) SetAccepting(id string, accepting bool) (*Outcome, error) {
	out := s.reset()
	w, ok := s.workers[id]
	if !ok {
		return out, fmt.Errorf("%w: %s", ErrUnknownWorker, id)
	}
	s.setAccepting(w, accepting)
	s.fill(w)
	if !accepting {
		s.offerFree() // tasks that waited for this worker's labels may go elsewhere
	}
	return s.settle(out), nil
}

// SetLoadable replaces the labels a worker's backend can load (empty means any), as
// its agent reports when they change while connected: a model added to Triton's
// repository. Labels it holds stay held and keep running tasks; only new loads follow
// the new list. Queued tasks for a label it can now load may go to it at once.
func (s *Scheduler) SetLoadable(id string, loadable []string) (*Outcome, error) {
	out := s.reset()
	w, ok := s.workers[id]
	if !ok {
		return out, fmt.Errorf("%w: %s", ErrUnknownWorker, id)
	}
	next := loadableSet(loadable)
	if maps.Equal(next, w.loadable) { // loadableSet gives nil, never an empty set, for "any"
		return s.settle(out), nil // the same list again: nothing changed, so no new settling wait
	}
	s.countLoadable(w, -1)
	w.loadable = next
	s.countLoadable(w, 1)
	// As when a worker comes or goes: another agent may be about to report the label
	// (a model being replaced), so tasks for one no worker lists wait out FleetSettle.
	s.fleetChanged = s.now
	s.sweepUnloadable = true
	s.fill(w)
	return s.settle(out), nil
}

// loadableSet is a worker's loadable labels as a set; nil (any label) for none.
func loadableSet(labels []string) map[string]struct{} {
	if len(labels) == 0 {
		return nil
	}
	set := make(map[string]struct{}, len(labels))
	for _, l := range labels {
		set[l] = struct{}{}
	}
	return set
}

// setAccepting changes w.accepting and the counts that depend on it.
func (s *Scheduler) setAccepting(w *worker, accepting bool) {
	if w.accepting == accepting {
		return
	}
	for _, h := range w.held {
		if h.doomed {
			continue
		}
		if accepting {
			h.state.active++
			s.noteServed(h.state)
		} else {
			h.state.active--
			s.lostHolder(h.state, h.label)
		}
	}
	w.accepting = accepting
	if !accepting {
		unreserve(w) // another worker may free a slot for the task instead
	}
	s.refreshFree(w)
}

// Submit routes a new task: at once to a worker, or into the queue. The task must be
// fresh (zero state); the scheduler owns it until it comes back in an Outcome or
// through Complete.
func (s *Scheduler) Submit(t *Task) (*Outcome, error) {
	out := s.reset()
	if t.state != stateNew {
		return out, ErrTaskInUse
	}
	t.seq = s.nextSeq
	s.nextSeq++
	t.Enqueued = s.now
	// Number its attempts after those of an earlier run of the id that overran and may
	// still be running (see AttemptNumber). Refusing the run until they end would leave
	// the id unusable for as long as a backend hangs; renumbering costs nothing.
	t.AttemptBase = s.overrunHeld[t.ID].top
	// Its deadline may have passed before it got here (the owner sets it before a slow
	// journal write, say): rule 6, never run it, with no load or eviction on its behalf.
	if !t.Deadline.IsZero() && !t.Deadline.After(s.now) {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailDeadline})
		return s.settle(out), nil
	}
	if lf := s.failingNow(t.Label, t.Enqueued); lf != nil {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailLabelFailing, LoadError: lf.lastError})
		return s.settle(out), nil
	}
	if !s.someWorkerCanLoad(t.Label) {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailNoWorkerCanLoad})
		return s.settle(out), nil
	}
	// Placed or queued below, so the label's state stays; place finds it through the task.
	t.labelState = s.label(t.Label)
	t.labelState.arrived(t.Enqueued)
	if !s.place(t) {
		s.enqueue(t, false)
		if !s.loadableNow(t.Label) { // it waits only because the fleet is changing
			s.sweepUnloadable = true
		}
	}
	return s.settle(out), nil
}

// countLoadable adds (delta 1) or removes (-1) w's backend's labels from the counts
// someWorkerCanLoad reads.
func (s *Scheduler) countLoadable(w *worker, delta int) {
	if w.loadable == nil {
		s.anyLabel += delta
		return
	}
	for l := range w.loadable {
		if s.loadableBy[l] += delta; s.loadableBy[l] == 0 {
			delete(s.loadableBy, l)
		}
	}
}

// someWorkerCanLoad reports whether a connected worker can load label, or holds it.
// With no worker connected, or within FleetSettle of one connecting or leaving, it is
// true: a worker that can may yet connect, and the task waits for it within its
// deadline.
func (s *Scheduler) someWorkerCanLoad(label string) bool {
	return len(s.workers) == 0 || s.now.Sub(s.fleetChanged) < s.cfg.FleetSettle || s.loadableNow(label)
}

// loadableNow reports whether a connected worker can load label, or holds it.
func (s *Scheduler) loadableNow(label string) bool {
	if s.anyLabel > 0 || s.loadableBy[label] > 0 {
		return true
	}
	ls := s.labels[label]
	return ls != nil && ls.holders > 0
}

// Observation is what a finished task teaches the scheduler about its label.
type Observation struct {
	// Loaded is true when the worker had to load the label for the task.
	Loaded bool
	// LoadTime is how long the worker waited for the label: its own load, or with
	// Loaded false another attempt's load it joined (zero on a plain hit). RunTime is
	// how long the task ran. Both are the worker's own measures: the rest of the time
	// the owner saw the attempt take is delay outside the task (see observeDelay).
	LoadTime time.Duration
	RunTime  time.Duration
	// Failed is true when the attempt did not succeed. With Loaded false it may have
	// ended before its label was loaded (its deadline passed first, say), so a load the
	// scheduler counted on may never have started.
	Failed bool
}

// Complete records that a task attempt ended on a worker (well or not) and lets the
// worker take its next task.
func (s *Scheduler) Complete(workerID string, t *Task, obs Observation) (*Outcome, error) {
	out := s.reset()
	w, i, err := s.runningOn(workerID, t)
	if err != nil {
		return out, err
	}
	s.unrun(w, i, t)
	t.state = stateDone
	if !obs.Failed { // a failed attempt may not say what it spent (a load cut short)
		s.observeDelay(s.now.Sub(t.Started) - obs.LoadTime - obs.RunTime)
	}
	s.learn(w, t.Label, obs)
	s.release(w, t.Label, obs.Loaded, obs.Failed && !obs.Loaded)
	s.fill(w)
	return s.settle(out), nil
}

// delayHalfLife is how fast the delay slack forgets a delay: it halves every minute. A
// busy host renews it with every stall; one stall on a quiet host fades in minutes.
const delayHalfLife = time.Minute

// observeDelay records the delay of an attempt that ended: how much longer it took on
// the owner's clock, from its assignment to its result, than its worker says it spent
// loading and running. That is time outside the task (the frames crossing the
// network, the agent and the owner waiting for a CPU on a busy host), and it does not
// shrink with the task: on a host busy with other work it was 30 ms to 2 s for about
// 1 result in 100, on tasks of 2 ms. The largest recent delay is the slack remaining
// allows a running attempt before it counts as overrunning. (The simulator has no such delay: its slack stays 0.)
//
// A delay counts for at most MaxDelaySlack. The slack is one figure for every holder,
// so one stall of one worker (a 10 s network outage) made every stuck holder in the
// fleet pass for stalled until it had halved down to their loads, minutes later, and
// their queued tasks waited that long rather than load elsewhere. Capped where it is
// observed, not where it is used, it also fades from the cap at once, not after
// halving down to it.
func (s *Scheduler) observeDelay(d time.Duration) {
	d = min(d, s.cfg.MaxDelaySlack)
	// The decayed maximum is the same whether or not it is re-anchored at every
	// observation (halving is memoryless), so only a new maximum is stored.
	if d <= 0 || (d < s.delay && d <= s.slackNow()) {
		return
	}
	s.delay, s.delayAt = d, s.now
	s.slack, s.slackOK = d, true
}

// slackNow is delaySlack at the call's now, computed once per call.
func (s *Scheduler) slackNow() time.Duration {
	if !s.slackOK {
		s.slack, s.slackOK = s.delaySlack(s.now), true
	}
	return s.slack
}

// DelaySlack is how far past its estimate a running attempt may go before it counts as
// overrunning: the largest delay outside the task seen lately, at most MaxDelaySlack
// (see observeDelay).
func (s *Scheduler) DelaySlack() time.Duration { return s.delaySlack(s.clock.Now()) }

// delaySlack is the largest delay observed (observeDelay), halved for every
// delayHalfLife since: a decaying maximum, because the stalls it stands for are rare
// (about 1 attempt in 100 on the busy host) and an average would forget them between
// one and the next.
func (s *Scheduler) delaySlack(now time.Time) time.Duration {
	age := now.Sub(s.delayAt)
	if s.delay <= 0 || age <= 0 {
		return max(s.delay, 0)
	}
	return time.Duration(float64(s.delay) * math.Exp2(-float64(age)/float64(delayHalfLife)))
}

// learn records what an attempt of label that ended on w showed: the label's load and
// run estimates, and the run time w has shown for it.
func (s *Scheduler) learn(w *worker, label string, obs Observation) {
	s.observe(label, obs)
	if i := w.find(label); i >= 0 && obs.RunTime > 0 {
		h := w.held[i]
		if h.runEst == 0 {
			h.runEst = obs.RunTime
		} else {
			h.runEst = ewma(h.runEst, obs.RunTime)
		}
	}
}

// release ends one task's use of a label on w: a doomed label goes with its last task.
// unstarted says the attempt ended without its label loaded for it (refused, or over
// before it began).
func (s *Scheduler) release(w *worker, label string, loaded, unstarted bool) {
	if i := w.find(label); i >= 0 {
		h := w.held[i]
		h.inUse--
		if loaded {
			h.pending = false
		}
		if unstarted && h.pending && !h.loading {
			// The load this copy was assigned for has not started (no LOADING event),
			// and the attempt that ended did not start it: the worker does not hold the
			// label. Another attempt may still load it; LOADED then revives the copy.
			// No LOAD_FAILED will come for this load: it is no longer one asked.
			s.doom(w, h)
			delete(w.loadsAsked, label)
		}
		if h.doomed && h.inUse == 0 {
			s.dropHeld(w, i)
		}
	}
	s.refreshFree(w)
}

// runningOn finds the worker workerID and t's place among its running tasks, or
// returns the error Complete, Requeue and LoadFailed give for a report that matches no
// running attempt.
func (s *Scheduler) runningOn(workerID string, t *Task) (*worker, int, error) {
	w, ok := s.workers[workerID]
	if !ok {
		return nil, -1, fmt.Errorf("%w: %s", ErrUnknownWorker, workerID)
	}
	i := w.runningIndex(t)
	if i < 0 {
		return nil, -1, fmt.Errorf("%w: %s on %s", ErrUnknownTask, t.ID, workerID)
	}
	return w, i, nil
}

// unrun removes t, at index i of w.running, from the worker.
func (s *Scheduler) unrun(w *worker, i int, t *Task) {
	w.running[i] = w.running[len(w.running)-1]
	w.running[len(w.running)-1] = nil
	w.running = w.running[:len(w.running)-1]
	t.worker = nil
	s.unwatchDeadline(t)
}

// unwatchDeadline takes a task that stops running out of runningDeadline.
func (s *Scheduler) unwatchDeadline(t *Task) {
	if t.heapIdx >= 0 {
		heap.Remove(&s.runningDeadline, t.heapIdx)
	}
}

// takeBack removes a running task, at index i of w.running, from its worker without
// refilling the worker.
func (s *Scheduler) takeBack(w *worker, i int, t *Task, unstarted bool) {
	s.unrun(w, i, t)
	s.release(w, t.Label, false, unstarted)
}

// Abandon forgets a running task whose answer the owner gave without the worker (a
// shutdown that ran out of time). The worker's slot is freed but not refilled.
func (s *Scheduler) Abandon(t *Task) bool {
	if t.state != stateRunning || t.worker == nil {
		return false
	}
	w := t.worker
	if i := w.runningIndex(t); i >= 0 {
		s.takeBack(w, i, t, false) // what the worker does with it is unknown
	}
	t.state = stateDone
	return true
}

// Withdraw takes back an assignment of an Outcome that the owner did not send (during
// shutdown, a journaled task it lets go of instead), as though it had not been made:
// the start is not counted, the copy of the label it was to load goes unless another
// attempt uses it, and the label it named for eviction, which the worker still holds,
// is back in the worker's view. The task is done with, as after Abandon. Withdraw
// returns no Outcome, the owner being in the middle of acting on one: the next call's
// refills the freed slot. It reports false when a.Task is not running on a.WorkerID.
func (s *Scheduler) Withdraw(a Assignment) bool {
	t, w := a.Task, a.Task.worker
	if t.state != stateRunning || w == nil || w.id != a.WorkerID {
		return false
	}
	i := w.runningIndex(t)
	if i < 0 {
		return false
	}
	// Only a load this assignment asked for is one that never started: a copy it
	// joined waits for a load an assignment that was sent asked for.
	s.takeBack(w, i, t, a.Load)
	t.Attempt--
	t.state = stateDone
	if a.EvictLabel != "" {
		s.unevict(w, a.EvictLabel)
	}
	s.wakeWorkers = append(s.wakeWorkers, w)
	return true
}

// unevict puts label back in w's view: an assignment that named it for eviction was
// not sent. Not when w has no room (the copy the assignment was to load stays while
// another attempt uses it) or holds the label again (a later assignment of the same
// Outcome loads it). It comes back as it left, the first to go: least recently used,
// not fresh.
func (s *Scheduler) unevict(w *worker, label string) {
	delete(w.evictsAsked, label)
	if w.find(label) >= 0 || len(w.held) >= w.capacity {
		return
	}
	s.addHeld(w, label, false)
	h := w.held[len(w.held)-1]
	h.lastUse, h.loadedAt = 0, time.Time{}
	s.refreshFree(w)
}

// Requeue takes back an attempt the worker refused without running it (draining, no
// free slot, backend down): the task goes to the front of the queue and may start
// elsewhere at once. Refused attempts count towards MaxAttempts, so a task cannot
// bounce between refusing workers for ever.
func (s *Scheduler) Requeue(workerID string, t *Task) (*Outcome, error) {
	out := s.reset()
	w, i, err := s.runningOn(workerID, t)
	if err != nil {
		return out, err
	}
	s.takeBack(w, i, t, true)
	if t.Attempt >= s.cfg.MaxAttempts {
		s.failSpent(t)
		return s.settle(out), nil
	}
	s.enqueue(t, true)
	s.expireDue() // its deadline may have passed since it was assigned
	// The refusing worker sits out this round: its refusal may have overtaken the
	// status frame that says it stopped accepting.
	if w.accepting {
		s.setAccepting(w, false)
		defer s.setAccepting(w, true)
	}
	if t.state == stateQueued {
		s.place(t)
	}
	s.offerFree()
	return s.settle(out), nil
}

// Expire fails every queued task whose deadline has passed. Its Outcome may assign
// tasks too: to a worker that was freeing a label for a task that expired, say, or
// that a call returning no Outcome (Cancel, Abandon, Withdraw) left able to take one.
func (s *Scheduler) Expire() *Outcome {
	out := s.reset()
	s.expireDue()
	return s.settle(out)
}

// ExpireRunning fails, with FailOverrun, every running attempt whose deadline passed
// grace or more ago: its worker was told the deadline and has not answered since (a
// backend call that ignores cancellation, a hung agent). The task leaves the
// scheduler, as with Abandon, but its slot stays busy, since the worker never said it
// stopped: a stand-in holds it until the worker's late result (EndOverrun) or its
// removal, and is never requeued; a new run of the task's id submitted meanwhile
// numbers its attempts after it (see AttemptNumber). The owner should tell the worker
// to cancel the attempt. The cost is that of the attempts expired: the running attempts are in a
// heap by deadline.
func (s *Scheduler) ExpireRunning(grace time.Duration) *Outcome {
	out := s.reset()
	cutoff := s.now.Add(-grace)
	for len(s.runningDeadline) > 0 && !s.runningDeadline[0].Deadline.After(cutoff) {
		t := heap.Pop(&s.runningDeadline).(*Task)
		w := t.worker
		i := w.runningIndex(t)
		// A copy the owner never sees: t goes back to the owner, who answers it, and
		// the scheduler keeps no pointer into an answered task's record.
		w.running[i] = &Task{ID: t.ID, Label: t.Label, Deadline: t.Deadline, Attempt: t.Attempt,
			AttemptBase: t.AttemptBase, Enqueued: t.Enqueued, Started: t.Started, state: stateOverran,
			worker: w, labelState: t.labelState, heapIdx: -1}
		s.holdOverrun(t.ID, t.AttemptNumber())
		t.worker = nil
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailOverrun, WorkerID: w.id})
	}
	return s.settle(out)
}

// EndOverrun frees the slot a worker's overrun attempt held (see ExpireRunning), now
// that its late result came, and lets the worker take its next task. attempt is the
// number the worker was given (AttemptNumber). It reports false when no attempt of
// that task overran on that worker. The result teaches what any result does, its run
// time included: the slot was busy with the label for that long, and a holder whose
// runs can overrun must not look about to free up. (A worker that honours the
// deadline reports a run cut short there, which Complete learns as well.)
func (s *Scheduler) EndOverrun(workerID, taskID string, attempt int, obs Observation) (*Outcome, bool) {
	out := s.reset()
	w, ok := s.workers[workerID]
	if !ok {
		return out, false
	}
	for i, t := range w.running {
		if t.state != stateOverran || t.ID != taskID || t.AttemptNumber() != attempt {
			continue
		}
		s.unrun(w, i, t)
		t.state = stateDone
		s.unholdOverrun(t.ID)
		s.learn(w, t.Label, obs)
		s.release(w, t.Label, obs.Loaded, obs.Failed && !obs.Loaded)
		s.fill(w)
		return s.settle(out), true // the release may have doomed a copy others wait on
	}
	return out, false
}

// overrunAttempts are the stand-ins of one task id: how many hold slots, and the
// highest attempt number among those held since the first of them. The number stays
// until the last one ends, so a run submitted meanwhile reuses no number a stand-in
// held.
type overrunAttempts struct{ held, top int }

// holdOverrun records a stand-in of task id whose attempt number is n.
func (s *Scheduler) holdOverrun(id string, n int) {
	o := s.overrunHeld[id]
	o.held++
	o.top = max(o.top, n)
	s.overrunHeld[id] = o
}

// unholdOverrun records that a stand-in of task id freed its slot.
func (s *Scheduler) unholdOverrun(id string) {
	o := s.overrunHeld[id]
	if o.held--; o.held <= 0 {
		delete(s.overrunHeld, id)
		return
	}
	s.overrunHeld[id] = o
}

// NextDeadline is the earliest deadline among queued tasks.
func (s *Scheduler) NextDeadline() (time.Time, bool) {
	if len(s.deadline) == 0 {
		return time.Time{}, false
	}
	return s.deadline[0].Deadline, true
}

// Cancel removes a queued task; it reports false when the task is not queued. A worker
// that was freeing a label for it takes tasks again in the next call's Outcome.
func (s *Scheduler) Cancel(t *Task) bool {
	if t.state != stateQueued {
		return false
	}
	s.unqueue(t)
	t.state = stateDone
	return true
}

// LabelLoaded confirms that a worker holds a label (a load it was told to do, or one
// it reports on its own). Unknown workers are ignored.
func (s *Scheduler) LabelLoaded(workerID, label string) *Outcome {
	out := s.reset()
	w, ok := s.workers[workerID]
	if !ok {
		return s.settle(out)
	}
	delete(w.loadsAsked, label)
	delete(w.evictsAsked, label) // kept after all (the agent's confirmation of a refused eviction)
	if i := w.find(label); i >= 0 {
		// A load that works ends the label's bad run. Only for a copy in the view: the
		// agent also confirms labels it kept (see confirmKept), which proves nothing
		// about loading them.
		delete(s.failing, label)
		h := w.held[i]
		wasPending := h.pending
		h.pending = false
		if h.doomed {
			// An eviction reported for an earlier copy doomed this one: the unload of
			// one task raced the assignment that loads the label again on the same
			// worker. Events arrive in order, so this load came after it.
			s.undoom(w, h)
			s.fill(w)
		} else if wasPending {
			// Tasks may have queued for a busy holder rather than wait out this load.
			s.fill(w)
		}
		return s.settle(out)
	}
	// The worker loaded a label we did not ask for: believe it, making room in our
	// view by dropping the least recently used label that is not in use.
	if len(w.held) >= w.capacity {
		v := s.lruVictim(w)
		if v < 0 {
			return s.settle(out)
		}
		s.dropHeld(w, v)
	}
	s.addHeld(w, label, false)
	s.refreshFree(w)
	s.fill(w)
	return s.settle(out)
}

// LabelLoading records that a worker started loading a label (a LOADING event): a copy
// waiting for its load is then not taken for one whose load never started.
func (s *Scheduler) LabelLoading(workerID, label string) {
	if w, ok := s.workers[workerID]; ok {
		if i := w.find(label); i >= 0 {
			w.held[i].loading = true
		}
	}
}

// Unloaded reports whether a worker's EVICTED event for label means it unloaded a
// copy: one it was sent a task to evict, or one it holds loaded. Not a load it gave up
// before it was made, nor a label it never had: those are no evictions, and counting
// them would let one agent mint a metric series per made-up label. Call it before
// LabelGone.
func (s *Scheduler) Unloaded(workerID, label string) bool {
	w, ok := s.workers[workerID]
	if !ok {
		return false
	}
	if _, asked := w.evictsAsked[label]; asked {
		delete(w.evictsAsked, label)
		return true
	}
	i := w.find(label)
	return i >= 0 && !w.held[i].pending
}

// LabelGone records that a worker no longer holds a label (evicted on its own, or a
// load that failed). Tasks queued for it stay queued for other holders or a load.
func (s *Scheduler) LabelGone(workerID, label string) *Outcome {
	out := s.reset()
	s.labelGone(workerID, label)
	return s.settle(out)
}

func (s *Scheduler) labelGone(workerID, label string) {
	w, ok := s.workers[workerID]
	if !ok {
		return
	}
	delete(w.loadsAsked, label) // an agent that gave up a load (EVICTED) sends no LOAD_FAILED
	i := w.find(label)
	if i < 0 {
		return
	}
	if s.dropOrDoom(w, i) {
		s.fill(w)
	}
	s.offerFree() // tasks that waited for this copy may load elsewhere
}

// dropOrDoom takes w.held[i] out of the view: at once when no task uses it (reporting
// true), else when its last task ends.
func (s *Scheduler) dropOrDoom(w *worker, i int) (dropped bool) {
	if h := w.held[i]; h.inUse > 0 {
		s.doom(w, h)
		return false
	}
	s.dropHeld(w, i)
	s.refreshFree(w)
	return true
}

// QueuedTasks is the number of tasks waiting.
func (s *Scheduler) QueuedTasks() int { return s.queued }

// Queued is the number of tasks waiting for a label.
func (s *Scheduler) Queued(label string) int {
	if ls := s.labels[label]; ls != nil {
		return ls.queued
	}
	return 0
}

// ----- placement ------------------------------------------------------------------

// place tries to start t now. It returns false when t must wait.
func (s *Scheduler) place(t *Task) bool {
	if s.cfg.Policy == PolicyRandom {
		// A random free worker; if it cannot take the task (every label in use, or the
		// label is not loadable there), the next ones in turn, a bounded number.
		n := s.free.len()
		for i, start := 0, s.rngStart(n); i < n && i < placeTries; i++ {
			if w := s.free.at((start + i) % n); w.takes(t) && s.canTake(w, t) {
				return s.assignLoading(w, t, LoadRandom)
			}
		}
		return false
	}
	ls := t.labelState // set by Submit for a new task, by enqueue for a queued one
	ahead := 0
	if ls != nil {
		ahead = ls.queued
		if t.state == stateQueued {
			ahead-- // it is counted in its own queue
		}
	}
	if ls != nil && ls.idle.len() > 0 {
		if w := ls.idle.last(); !t.excludes(w.id) && w.takes(t) {
			if h := w.heldOf(ls); s.loadedEnough(h) {
				s.assign(w, h, t)
				return true
			}
		}
		// An idle holder whose copy is still loading serves the task only when the rest
		// of its load ends sooner than a busy holder frees up; a loaded idle holder wins.
		var loading *heldLabel
		var loadingOn *worker
		for i := 0; i < ls.idle.len() && i < placeTries; i++ {
			w := ls.idle.at(i)
			if t.excludes(w.id) || !w.takes(t) {
				continue
			}
			h := w.heldOf(ls)
			if s.loadedEnough(h) {
				s.assign(w, h, t)
				return true
			}
			if loading == nil || h.loadedAt.Before(loading.loadedAt) {
				loading, loadingOn = h, w
			}
		}
		if loading != nil && s.loadEndBeatsWait(loading, ahead) {
			s.assign(loadingOn, loading, t)
			return true
		}
	}
	why := LoadNoHolder
	if ls != nil && ls.active > 0 {
		// Without the target's eviction first: most tasks for a busy holder wait, and
		// finding the target costs more than the wait estimate.
		if why = s.loadWins(t.Label, ls, ahead, 0); why == 0 {
			return false
		}
	}
	w := s.loadTarget(t)
	if w == nil {
		return false
	}
	if why == LoadBeatsWait {
		if r := s.regret(w, t); r > 0 {
			if why = s.loadWins(t.Label, ls, ahead, r); why == 0 {
				return false
			}
		}
	}
	return s.assignLoading(w, t, why)
}

// placeTries bounds how many workers one placement looks at, keeping it O(1) in the
// fleet size.
const placeTries = 8

func (s *Scheduler) rngStart(n int) int {
	if n == 0 {
		return 0
	}
	return s.rng.IntN(n)
}

// loadWins is the cost model of rule 2: LoadBeatsWait when loading the label on a
// free worker (its learned load time plus run time) is expected to finish the task
// sooner than waiting behind `ahead` queued tasks for the label's busy holders, by at
// least half a load and regret (what the load's eviction costs, see regret);
// LoadOutpaced when the label's holders are outpaced by its demand (see outpaced);
// 0 when waiting wins. The half-load margin stands for what a load costs beyond its
// own time (memory, an eviction that may need reloading later), and it keeps a burst
// of first requests waiting for the load already under way instead of starting loads
// elsewhere.
func (s *Scheduler) loadWins(label string, ls *labelState, ahead int, regret time.Duration) LoadReason {
	st := s.statsOf(ls)
	start, run, slots := s.expectedStart(label, ls, ahead, st)
	if st.load+st.load/2+regret+st.run < start+run {
		return LoadBeatsWait
	}
	if ahead > 0 && s.outpaced(ls, st, run, slots) {
		return LoadOutpaced
	}
	return 0
}

// outpaced reports whether a label's submissions have come faster than its holders'
// slots run them (`run` each), by a quarter or more, in a stretch of arrivals lasting
// at least a load time. Such a backlog grows for as long as no copy is added: waiting
// until it is a load and a half long, as the first test in loadWins does, makes
// every task behind it wait too. The margin keeps demand near the holders' capacity,
// and the span a burst (its arrivals span no time), from loading copies that would
// soon sit idle. A rate that arrivals have stopped renewing fades: the time since the
// last one counts as a gap.
func (s *Scheduler) outpaced(ls *labelState, st estimate, run time.Duration, slots int) bool {
	if !ls.gapSeen || ls.lastArrival.Sub(ls.firstArrival) < st.load {
		return false
	}
	gap := max(ls.arrivalGap, s.now.Sub(ls.lastArrival))
	return 4*float64(run) > 5*float64(gap)*float64(slots) // in floats: no overflow
}

// holderSample bounds how many holders the wait estimate looks at, keeping it O(1) in
// the fleet size.
const holderSample = 8

// expectedWait estimates how long a task waits for a holder of its label with `ahead`
// tasks queued before it, its own run included (see expectedStart).
func (s *Scheduler) expectedWait(label string, ls *labelState, ahead int, st estimate) time.Duration {
	start, run, _ := s.expectedStart(label, ls, ahead, st)
	return start + run
}

// expectedStart estimates when a holder of the label starts a task with `ahead` tasks
// queued before it, and how long the task then runs: the earliest time a holder is
// expected to free up for the label (what is left of the task it runs, or of its copy's
// load while that is in progress), plus the queue ahead shared among the holders'
// slots (slotsFor), at the run time each has shown for this label. It also returns the
// holders' slots (estimated from the sampled ones).
func (s *Scheduler) expectedStart(label string, ls *labelState, ahead int, st estimate) (start, run time.Duration, slots int) {
	soonest := time.Duration(-1)
	var runSum time.Duration
	n, slotSum := 0, 0
	for i := 0; i < ls.all.len() && n < holderSample; i++ {
		w := ls.all.at(i)
		h := w.held[w.find(label)]
		if !w.accepting || h.doomed {
			continue
		}
		n++
		run := st.run
		if h.runEst > 0 {
			run = h.runEst
		}
		runSum += run
		slotSum += s.slotsFor(w, h, run)
		// A copy still loading serves nobody until it is loaded, free slots or not.
		free := max(s.remaining(w), s.loadLeft(h, st))
		if soonest < 0 || free < soonest {
			soonest = free
		}
	}
	if n == 0 {
		return 0, 0, 0
	}
	run = runSum / time.Duration(n)
	slots = slotSum * ls.active / n
	perSlot := float64(ahead) / float64(slots)
	return soonest + time.Duration(perSlot*float64(run)), run, slots
}

// longRunFactor: a slot running another label whose tasks run this many times longer
// than a label's own does not count among the slots that serve the label's queue.
const longRunFactor = 4

// slotsFor is how many of holder w's slots serve the queue of its label h, whose tasks
// run `run` each: all of them, but those running another label whose runs take far
// longer (longRunFactor), which do not turn over at the queue's pace. A slot busy
// loading counts: a load ends once, and the slot then takes whatever waits. At least
// one: the soonest start counts the first slot to free up.
func (s *Scheduler) slotsFor(w *worker, h *heldLabel, run time.Duration) int {
	n := w.slots
	if h.inUse == len(w.running) { // it runs nothing else: the usual case
		return n
	}
	for _, other := range w.held { // by label, not by task: fewer, and each knows its run
		if other == h || other.inUse == 0 {
			continue
		}
		otherRun := other.runEst
		if otherRun == 0 {
			otherRun = s.statsOf(other.state).run
		}
		if otherRun > longRunFactor*run {
			n -= other.inUse
		}
	}
	return max(n, 1)
}

// loadLeft is how long h's copy is expected to go on loading: zero once loaded, else
// what its label's load estimate leaves since the load was assigned (zero past it: a
// load past its estimate is taken to be ending now, like a task past its run time).
func (s *Scheduler) loadLeft(h *heldLabel, st estimate) time.Duration {
	if !h.pending {
		return 0
	}
	return max(st.load-s.now.Sub(h.loadedAt), 0)
}

// loadedEnough reports whether h's copy can run a task now, as far as the scheduler
// knows: it is loaded, or its load is expected to have ended.
func (s *Scheduler) loadedEnough(h *heldLabel) bool {
	return !h.pending || s.loadLeft(h, s.statsOf(h.state)) == 0
}

// loadEndBeatsWait reports whether a task with `ahead` queued before it starts no later
// on a free slot of the worker whose copy h is still loading (when the load ends) than
// by waiting in the queue for a holder. Starts are compared, the run being the same
// either way; a tie goes to the loading copy, which counts among the holders itself.
func (s *Scheduler) loadEndBeatsWait(h *heldLabel, ahead int) bool {
	st := s.statsOf(h.state)
	start, _, _ := s.expectedStart(h.label, h.state, ahead, st)
	return s.loadLeft(h, st) <= start
}

// remaining is how long until w is expected to have a free slot: zero when it has one,
// else the least time left among its running tasks by their labels' estimates. A task
// that has overrun its estimate is not taken to be ending now: it is expected to go on
// for as long again as it has overrun (zero at the estimate, growing after), so that a
// holder stuck on a long task stops looking about to free and the tasks waiting for it
// are loaded elsewhere (overdue, loadWins) instead of waiting out their bound.
//
// The overrun counts only past the delay slack (delaySlack): an attempt whose result
// is no later than results have lately been for reasons outside the task is taken to
// be ending now. Without it a host stall read as a stuck holder whenever loads were
// not far longer than the stall: on seed-4 at time-scale 0.05 (20 ms loads, 2 ms
// runs) on a busy host, a 30 to 140 ms stall of a holder's 2 ms task loaded its label
// on the other worker, evicting the only copy of a label that the next task for it
// then loaded again: two misses a stall, 4 to 7 stalls a run. The slack is at most
// MaxDelaySlack, so a stuck holder is still found once its task is that, and a load
// and a half (with any regret), past its estimate.
func (s *Scheduler) remaining(w *worker) time.Duration {
	if len(w.running) < w.slots {
		return 0
	}
	left := time.Duration(-1)
	for _, t := range w.running {
		d := s.expectedRun(w, t) - s.now.Sub(t.Started)
		if d < 0 {
			d = max(-d-s.slackNow(), 0)
		}
		if left < 0 || d < left {
			left = d
		}
	}
	return max(left, 0)
}

// expectedRun is how long running task t takes on w from its start: the run time w has
// shown for its label, plus the label's load time while its load is still under way.
// This runs for every running task of every holder sampled on every placement that
// finds no idle holder, so the label is found by its state pointer, which the task
// took when it started (a running task's label is held and cannot be forgotten),
// rather than by comparing names.
func (s *Scheduler) expectedRun(w *worker, t *Task) time.Duration {
	h := w.heldOf(t.labelState)
	if h == nil { // cannot happen for a running task; the invariant check holds it
		return s.stats(t.Label).run
	}
	st := s.statsOf(h.state)
	expect := st.run
	if h.runEst > 0 {
		expect = h.runEst
	}
	if h.pending {
		expect += st.load
	}
	return expect
}

// passedOverTooLong reports whether a queued task has waited past its pass-over bound.
func (s *Scheduler) passedOverTooLong(t *Task) bool {
	loads := s.cfg.PassOverLoads * float64(s.statsOf(t.labelState).load)
	if loads >= math.MaxInt64 { // a load past MaxLoadTime: a bound past any wait, not a wrapped one
		return false
	}
	bound := max(s.cfg.MaxPassOver, time.Duration(loads))
	return s.now.Sub(t.Enqueued) >= bound
}

// overdue reports whether a queued task has already waited longer than a load and a
// run would have taken: the estimate that made it wait was wrong (a long task on the
// holder), so a free worker should load its label rather than keep it waiting. A load
// started when the task was queued would have met the delays outside the task too, so
// the wait counts only past the delay slack: a host stall alone makes no task overdue.
func (s *Scheduler) overdue(t *Task, regret time.Duration) bool {
	ls := t.labelState
	st := s.statsOf(ls)
	if s.now.Sub(t.Enqueued) <= st.load+st.run+s.slackNow() {
		return false
	}
	// Unless a holder is expected to take it within half a load: a task that waited
	// behind a long queue and is next for a holder about to free is not helped by a load.
	return ls.active == 0 || s.expectedWait(t.Label, ls, 0, st) > st.load/2+regret+st.run
}

// regret is what loading t's label on w is expected to cost beyond its own load and
// the half-load margin: the load of the label it evicts, when that is the only copy of
// a label still asked for (tasks queued, or one within two of its arrival gaps), for
// the next task for it loads it again. Nothing when w has room or the victim is a
// replica or has gone quiet. In a fleet where every label is a sole copy (seed-4: 4
// labels on 2 workers of 2), each load around a busy holder cost two misses, not one
// and a half: with loads of 20 ms, holders stalled 30 to 50 ms by a busy host were
// loaded around at twice the cost. (Simulator, ours: fleet seeds 1-20 761.5 -> 749.6
// misses, mean latency 45.2 -> 44.9 s; slow-loads seeds 1-30 58.9 -> 51.6, 326 -> 308
// ms; slow-loads-4slot seeds 1-20 77.5 -> 71.0, 862 -> 813 ms; seed-4 unchanged,
// seed-5 seeds 1-20 489.2 -> 490.0, 173.3 -> 173.4 ms.)
func (s *Scheduler) regret(w *worker, t *Task) time.Duration {
	if len(w.held) < w.capacity || w.find(t.Label) >= 0 {
		return 0
	}
	v, _ := s.victim(w)
	if v < 0 {
		return 0
	}
	ls := w.held[v].state
	if ls.holders > 1 || !(ls.queued > 0 || (ls.gapSeen && s.now.Sub(ls.lastArrival) <= 2*ls.arrivalGap)) {
		return 0
	}
	return s.statsOf(ls).load
}

// canTake reports whether w, which has a free slot, can start t now: it holds the
// label, or it may load it (loadable there, no failed copy still in use, and room or
// an idle label to evict).
func (s *Scheduler) canTake(w *worker, t *Task) bool {
	if t.excludes(w.id) {
		return false
	}
	if i := w.find(t.Label); i >= 0 {
		return !w.held[i].doomed
	}
	return w.canLoad(t.Label) && (len(w.held) < w.capacity || s.lruVictim(w) >= 0)
}

// mayLoad reports whether w could run t once it has a free slot and an idle label to
// evict: t's label is loadable there and has not failed there.
func mayLoad(w *worker, t *Task) bool {
	return !t.excludes(w.id) && w.canLoad(t.Label)
}

// reserve makes w free a slot and a label for t, which it cannot take yet: it takes no
// more tasks of one label it holds, so that label's running tasks end, it can be
// evicted, and t loads there. Its other labels keep serving their queues (they are in
// use anyway, so they do not delay it). The label is the one t's label is doomed as on
// w (it must go first), else the one with the fewest running tasks, the soonest idle.
// A label whose own queue holds an older task past its bound is not freed: that
// would pass over the older for the younger; with no other label to free, w is not
// reserved. (Refusing to free any label with an aged backlog, or to reserve for a label
// that has a holder, made the 4-slot simulation with a tight bound worse: 582 misses
// and 16.8 s mean latency against 298 and 6.6 s.)
func (s *Scheduler) reserve(w *worker, t *Task) {
	var freeing *heldLabel
	for _, h := range w.held {
		if h.label == t.Label {
			freeing = h
			break
		}
		if head := h.state.queue.head; head != nil && head.seq < t.seq && s.passedOverTooLong(head) {
			continue
		}
		if freeing == nil || h.inUse < freeing.inUse || (h.inUse == freeing.inUse && s.costOf(h).less(s.costOf(freeing))) {
			freeing = h
		}
	}
	if freeing == nil {
		return
	}
	w.reservedFor, t.reservedOn, t.freeing = t, w, freeing.label
}

// unreserve lets w take any task again: its task left the queue, w cannot load it any
// more, or w stopped accepting.
func unreserve(w *worker) {
	if t := w.reservedFor; t != nil {
		t.reservedOn, t.freeing, w.reservedFor = nil, "", nil
	}
}

// loadTarget picks a free worker to load t's label on: one with room first; otherwise
// among a few free workers the one whose eviction loses least (see evictionCost).
func (s *Scheduler) loadTarget(t *Task) *worker {
	for i, n := s.roomy.len()-1, 0; i >= 0 && n < placeTries; i, n = i-1, n+1 {
		if w := s.roomy.at(i); w.reservedFor == nil && s.canTake(w, t) {
			return w
		}
	}
	var best *worker
	var bestCost evictionCost
	for i, n := s.free.len()-1, 0; i >= 0 && n < placeTries; i, n = i-1, n+1 {
		w := s.free.at(i)
		if t.excludes(w.id) || w.reservedFor != nil { // its next idle label is taken
			continue
		}
		if j := w.find(t.Label); j >= 0 {
			if !w.held[j].doomed {
				return w // holds it already
			}
			continue
		}
		if !w.canLoad(t.Label) {
			continue
		}
		if len(w.held) < w.capacity {
			return w
		}
		v, c := s.victim(w)
		if v >= 0 && (best == nil || c.less(bestCost)) {
			best, bestCost = w, c
		}
	}
	return best
}

// assignLoading starts t on w, evicting w's least recently used idle label if w must
// load and has no room, for the reason why. The caller has checked canTake.
func (s *Scheduler) assignLoading(w *worker, t *Task, why LoadReason) bool {
	if i := w.find(t.Label); i >= 0 {
		if w.held[i].doomed {
			return false
		}
		s.assign(w, w.held[i], t)
		return true
	}
	evict := ""
	if len(w.held) >= w.capacity {
		v := s.lruVictim(w)
		if v < 0 {
			return false
		}
		evict = w.held[v].label
		s.dropHeld(w, v)
		if w.evictsAsked == nil {
			w.evictsAsked = map[string]struct{}{}
		}
		w.evictsAsked[evict] = struct{}{}
	}
	s.addHeld(w, t.Label, true)
	if w.loadsAsked == nil {
		w.loadsAsked = map[string]struct{}{}
	}
	w.loadsAsked[t.Label] = struct{}{}
	s.assign(w, w.held[len(w.held)-1], t)
	a := &s.out.Assigned[len(s.out.Assigned)-1]
	a.Load, a.EvictLabel, a.Reason = true, evict, why
	return true
}

// assign starts t on w, whose entry for t's label (perhaps pending a load) is h: the
// callers have it at hand, so the hit path does not look it up twice.
func (s *Scheduler) assign(w *worker, h *heldLabel, t *Task) {
	if t.state == stateQueued {
		s.unqueue(t)
	}
	t.state = stateRunning
	t.worker = w
	t.Attempt++
	t.Started = s.now
	w.running = append(w.running, t)
	t.heapIdx = -1
	if !t.Deadline.IsZero() {
		heap.Push(&s.runningDeadline, t)
	}
	t.labelState = h.state
	h.inUse++
	s.useTick++
	h.lastUse = s.useTick
	s.refreshFree(w)
	s.out.Assigned = append(s.out.Assigned, Assignment{Task: t, WorkerID: w.id})
}

// fill gives a worker with free slots the queued tasks it should run.
func (s *Scheduler) fill(w *worker) {
	s.expireDue() // never start a task whose deadline passed since the last Expire
	for w.isFree() && s.queued > 0 {
		t, why := s.pick(w)
		if t == nil || !s.assignLoading(w, t, why) {
			return
		}
	}
}

// settle ends a call that returns out: it fills the workers and offers the labels that
// wakeWorkers and wakeLabels name (filling may add more), then returns out.
func (s *Scheduler) settle(out *Outcome) *Outcome {
	for i, j := 0, 0; i < len(s.wakeWorkers) || j < len(s.wakeLabels); {
		if i < len(s.wakeWorkers) {
			w := s.wakeWorkers[i]
			i++
			if s.workers[w.id] == w { // not removed since
				s.fill(w)
			}
			continue
		}
		ls := s.labels[s.wakeLabels[j]]
		j++
		if ls == nil || ls.active > 0 || s.cfg.Policy == PolicyRandom {
			continue // served after all (or by the common FIFO, random mode)
		}
		// The oldest that some free worker can load (the first may have failed to load
		// on it), a few at most.
		for t, n := ls.queue.head, 0; t != nil && n < placeTries; t, n = t.byLabel.next, n+1 {
			if s.place(t) {
				s.fill(t.worker) // tasks behind it may join its load there
				break
			}
		}
	}
	clear(s.wakeWorkers)
	s.wakeWorkers = s.wakeWorkers[:0]
	clear(s.wakeLabels)
	s.wakeLabels = s.wakeLabels[:0]
	return out
}

// lostHolder notes that ls lost an active holder: when it was the last and tasks wait
// for the label, the label is unserved, and settle offers them to the free workers.
func (s *Scheduler) lostHolder(ls *labelState, label string) {
	s.noteServed(ls)
	if ls.active == 0 && ls.queued > 0 {
		s.wakeLabels = append(s.wakeLabels, label)
	}
}

// noteServed keeps s.unserved true for ls after its queued tasks or its active
// holders changed in number: O(1), so the queue and the holders pay nothing for it.
func (s *Scheduler) noteServed(ls *labelState) {
	unserved := ls.queued > 0 && ls.active == 0
	if unserved == (ls.unservedPos >= 0) {
		return
	}
	if unserved {
		ls.unservedPos = len(s.unserved)
		s.unserved = append(s.unserved, ls)
		return
	}
	i, last := ls.unservedPos, len(s.unserved)-1
	s.unserved[i] = s.unserved[last]
	s.unserved[i].unservedPos = i
	s.unserved[last] = nil
	s.unserved = s.unserved[:last]
	ls.unservedPos = -1
}

// rebalanceTries bounds how many free workers one offerFree call visits.
const rebalanceTries = 32

// offerFree lets free workers look at the queue again. Called when the reasons tasks
// were waiting may have gone (a holder left or stopped accepting, a copy failed) and
// periodically through Rebalance, so that no task waits for ever while a worker idles.
func (s *Scheduler) offerFree() {
	n := s.free.len()
	if n == 0 || s.queued == 0 {
		return
	}
	k := min(n, rebalanceTries)
	if s.offerPos >= n {
		s.offerPos = 0
	}
	// Taken first: fill moves workers within the set.
	buf := s.offerBuf[:0]
	for j := 0; j < k; j++ {
		buf = append(buf, s.free.at((s.offerPos+j)%n))
	}
	s.offerPos = (s.offerPos + k) % n
	for _, w := range buf {
		if s.queued == 0 {
			break
		}
		s.fill(w) // a no-op for a worker no longer free
	}
	clear(buf)
	s.offerBuf = buf[:0]
}

// Rebalance reconsiders waiting tasks against free workers: tasks passed over too
// long, and tasks whose wait for a busy holder has outrun what a load would cost. The
// owner calls it periodically (the dispatcher with its deadline check).
func (s *Scheduler) Rebalance() *Outcome {
	out := s.reset()
	s.pruneFailing()
	s.failUnloadable()
	// Another pass when one assigned something: a holder that took a task may have made
	// the wait for it long enough that a worker looked at earlier should load instead.
	for pass := 0; pass < 3 && s.queued > 0 && s.free.len() > 0; pass++ {
		before := len(out.Assigned)
		s.offerFree()
		if len(out.Assigned) == before {
			break
		}
	}
	return s.settle(out)
}

// failUnloadable fails the queued tasks whose label no connected worker can load, and
// those that failed to load on every one that could (failExcluded), once the fleet has
// settled: Submit lets them wait while workers come and go, and without
// this they would wait out their deadline (five minutes by default) for a worker that
// is not coming, to end in a 504 rather than the 503 a later submission gets at once.
// It walks every label's state, but only once after a change that may leave tasks so.
func (s *Scheduler) failUnloadable() {
	sweep := s.sweepUnloadable && len(s.workers) > 0 && s.now.Sub(s.fleetChanged) >= s.cfg.FleetSettle
	if len(s.excludedQueued) > 0 {
		s.failExcluded(sweep) // finished tasks' entries go whether settled or not
	}
	if !sweep {
		return
	}
	s.sweepUnloadable = false
	if s.anyLabel > 0 {
		return
	}
	var unloadable []string
	for name, ls := range s.labels {
		if ls.queued > 0 && !s.loadableNow(name) {
			unloadable = append(unloadable, name)
		}
	}
	slices.Sort(unloadable) // failures in a fixed order: the scheduler is deterministic
	for _, name := range unloadable {
		ls := s.labels[name]
		for ls.queue.head != nil { // oldest first; unqueue may forget ls, emptying it
			t := ls.queue.head
			s.unqueue(t)
			t.state = stateDone
			s.out.Failed = append(s.out.Failed, Failure{Task: t, Reason: FailNoWorkerCanLoad})
		}
	}
}

// passOverScan bounds how many of the oldest queued tasks it could take a freed worker
// looks at for one past its pass-over bound, keeping the cost of a completion
// independent of queue length.
const passOverScan = 8

// passOverWalk bounds how many queued tasks one pick walks past, counting those that
// passOverScan and the backlog scan do not. Rule 4's walk counts against it only the
// tasks whose label the worker cannot load; past it, agedBehind looks on through the
// labels' own queues.
const passOverWalk = 64

// pick chooses the next task for a worker that has a free slot, or nil, and the reason
// the worker loads its label should it not hold it. Every task it returns is one the
// worker can take.
func (s *Scheduler) pick(w *worker) (*Task, LoadReason) {
	head := s.queue.head
	if head == nil {
		return nil, 0
	}
	if r := w.reservedFor; r != nil {
		if s.canTake(w, r) {
			return r, LoadReserved
		}
		if !mayLoad(w, r) { // its backend no longer lists the label
			unreserve(w)
		}
	}
	if s.cfg.Policy == PolicyRandom {
		if s.canTake(w, head) {
			return head, LoadRandom
		}
		// The head is next in the FIFO: a worker that could load it frees a label for
		// it, or new tasks for its labels overtake the head for as long as they come.
		if w.reservedFor == nil && head.reservedOn == nil && mayLoad(w, head) {
			s.reserve(w, head)
		}
		// Else the oldest task it can take: a worker that cannot take the head (its
		// backend cannot load it, or every label is in use) must not idle while an
		// older task waits that a newer one would overtake on it (place takes any free
		// worker that can take a new task).
		return s.oldestTakeable(w, head.global.next), LoadRandom
	}
	// Rule 4: no task is passed over for longer than its bound; not only the head, which
	// this worker may be unable to take (its backend cannot load it, or it failed here).
	// n counts only tasks this worker could ever take: those it never can (their label
	// is not loadable here, or failed to load here) do not count, so that older tasks
	// for other workers cannot hide an aged task w could take behind them. (Counting one
	// task per label backlog instead looks further down the queue: with a tight bound,
	// 5 loads, the 4-slot simulation then served aged tasks all the more FIFO, 459
	// misses and 12.5 s mean latency against 298 and 6.6 s.)
	//
	// The walk's cost stays bounded. A task that failed to load here is passed without
	// limit: each is a load that failed on w, and a label that keeps failing is marked
	// failing and its queue emptied, so they are few. (Bounding them too let a worker
	// whose loads had failed 64 times in a row sit idle beside an aged task it could
	// load.) A task whose label w's backend cannot load is bounded, by passOverWalk:
	// a backlog for other workers can be any length. Past that bound, agedBehind looks
	// through the queues of the labels w can take instead, so that no such backlog
	// hides an aged task from w.
	n, unloadable := 0, 0
	for t := head; t != nil && n < passOverScan; t = t.global.next {
		if t.excludes(w.id) {
			continue
		}
		if !w.canLoad(t.Label) && w.find(t.Label) < 0 {
			if unloadable++; unloadable == passOverWalk {
				if aged := s.agedBehind(w); aged != nil {
					return aged, LoadPassedOver
				}
				break
			}
			continue
		}
		n++
		if s.takesAged(w, t) {
			return t, LoadPassedOver
		}
	}
	// The oldest task for a label this worker holds.
	var best *Task
	for _, h := range w.held {
		if h.doomed || (w.reservedFor != nil && h.label == w.reservedFor.freeing) {
			continue
		}
		if c := firstFor(&h.state.queue, w); c != nil && (best == nil || c.seq < best.seq) &&
			(s.loadedEnough(h) || s.loadEndBeatsWait(h, 0)) {
			best = c
		}
	}
	if best != nil {
		return best, 0 // held: no load
	}
	// Else the oldest label backlog better served by loading here than by waiting:
	// nobody can serve it, loading beats the expected wait, or it has waited too long.
	// n counts the label backlogs looked at; tasks behind a backlog's first do not
	// count, so one label's backlog cannot hide the rest (walked is the hard bound).
	n = 0
	for t, walked := head, 0; t != nil && n < passOverScan && walked < passOverWalk; t, walked = t.global.next, walked+1 {
		ls := t.labelState
		if firstFor(&ls.queue, w) != t {
			continue
		}
		n++
		if !w.takes(t) || !s.canTake(w, t) {
			continue
		}
		if ls.active == 0 {
			return t, LoadNoHolder
		}
		regret := s.regret(w, t)
		if why := s.loadWins(t.Label, ls, ls.queued-1, regret); why != 0 {
			return t, why
		}
		if s.overdue(t, regret) {
			return t, LoadOverdue
		}
	}
	// Else a label nobody serves that the scan did not reach: a long backlog of one
	// label, or of labels w cannot load, can fill the stretch it looks at, and w idled
	// beside a task it could load and no other worker would run.
	if t := s.oldestUnserved(w); t != nil {
		return t, LoadNoHolder
	}
	return nil, 0
}

// oldestUnserved is the oldest first task (see firstFor) of a label with tasks queued
// and no active holder that w may load now, or nil. Its cost is in such labels, which
// are few unless the fleet has no room to load them.
func (s *Scheduler) oldestUnserved(w *worker) *Task {
	if len(s.unserved) == 0 || w.reservedFor != nil { // reserved: it takes labels it holds, and no load
		return nil
	}
	// canTake's test for room, once. A copy w holds of an unserved label is doomed (w
	// accepts tasks), so w cannot take the label's tasks at all.
	if len(w.held) >= w.capacity && s.lruVictim(w) < 0 {
		return nil
	}
	var oldest *Task
	for _, ls := range s.unserved {
		for t := ls.queue.head; t != nil; t = t.byLabel.next {
			if t.excludes(w.id) { // passed without limit, as in the pass-over walk
				continue
			}
			if w.canLoad(t.Label) && w.find(t.Label) < 0 && (oldest == nil || t.seq < oldest.seq) {
				oldest = t
			}
			break
		}
	}
	return oldest
}

// takesAged reports whether w should start t now by rule 4: t has waited past its
// bound and w can take it. When t has and w could load it once a label of its own is
// idle (all are in use), w frees one for t, unless another worker does (one is enough;
// the fleet keeps serving).
func (s *Scheduler) takesAged(w *worker, t *Task) bool {
	if !s.passedOverTooLong(t) {
		return false
	}
	if w.takes(t) && s.canTake(w, t) {
		return true
	}
	if w.reservedFor == nil && t.reservedOn == nil && mayLoad(w, t) {
		s.reserve(w, t)
	}
	return false
}

// agedBehind is rule 4's walk carried on past passOverWalk tasks that w's backend
// cannot load (so w has a list of loadable labels): it returns the oldest task past its
// bound that w should start now (see takesAged), or nil. It looks, oldest first, at one
// task past its bound per queue of a label w can load or holds (see appendAged): w can
// take all of a label's tasks or none, but those that failed to load on it. Its cost is
// in the labels (those w lists, or those known when fewer), whatever the length of the
// backlogs w cannot take; and only a worker behind such a backlog pays it.
func (s *Scheduler) agedBehind(w *worker) *Task {
	aged := s.agedBuf[:0]
	if len(s.labels) < len(w.loadable) {
		for name, ls := range s.labels {
			if ls.queued > 0 && (w.canLoad(name) || w.heldOf(ls) != nil) {
				aged = s.appendAged(aged, ls, w)
			}
		}
	} else {
		for name := range w.loadable {
			if ls := s.labels[name]; ls != nil && ls.queued > 0 {
				aged = s.appendAged(aged, ls, w)
			}
		}
		for _, h := range w.held { // held but no longer listed (see SetLoadable)
			if h.state.queued > 0 && !w.canLoad(h.label) {
				aged = s.appendAged(aged, h.state, w)
			}
		}
	}
	// By age, as the walk meets them: the maps' order must not decide (determinism).
	slices.SortFunc(aged, func(a, b *Task) int { return cmp.Compare(a.seq, b.seq) })
	var take *Task
	for _, t := range aged {
		if s.takesAged(w, t) {
			take = t
			break
		}
	}
	clear(aged)
	s.agedBuf = aged[:0]
	return take
}

// appendAged appends to aged the first task in ls's queue past its bound that w may
// take (one that did not fail to load on w; as in the walk, those are passed without
// limit), if there is one. The queue holds its requeued tasks first, in no order of
// age, then those queued on submission, oldest first and sharing the label's bound: so
// the walk ends at the first of those, whether past its bound or not, having looked at
// as many tasks as attempts were lost, refused or failed, and no more.
func (s *Scheduler) appendAged(aged []*Task, ls *labelState, w *worker) []*Task {
	for t := ls.queue.head; t != nil; t = t.byLabel.next {
		if t.excludes(w.id) {
			continue
		}
		if s.passedOverTooLong(t) {
			return append(aged, t)
		}
		if !t.requeued {
			break
		}
	}
	return aged
}

// oldestTakeable is the first task from t on in the global queue, among passOverWalk,
// that w may take now (see takes and canTake), or nil.
func (s *Scheduler) oldestTakeable(w *worker, t *Task) *Task {
	// canTake's test for room, once: whether w has room or an idle label to evict.
	room := len(w.held) < w.capacity || s.lruVictim(w) >= 0
	for n := 0; t != nil && n < passOverWalk; t, n = t.global.next, n+1 {
		if t.excludes(w.id) || !w.takes(t) {
			continue
		}
		if i := w.find(t.Label); i >= 0 {
			if !w.held[i].doomed {
				return t
			}
		} else if room && w.canLoad(t.Label) {
			return t
		}
	}
	return nil
}

// ----- queue ----------------------------------------------------------------------

func (s *Scheduler) enqueue(t *Task, front bool) {
	ls := s.label(t.Label)
	t.state = stateQueued
	t.labelState = ls
	t.requeued = front
	if front {
		s.queue.pushFront(t)
		ls.queue.pushFront(t)
	} else {
		s.queue.pushBack(t)
		ls.queue.pushBack(t)
	}
	s.queued++
	ls.queued++
	s.noteServed(ls)
	t.heapIdx = -1
	if !t.Deadline.IsZero() {
		heap.Push(&s.deadline, t)
	}
}

func (s *Scheduler) unqueue(t *Task) {
	if w := t.reservedOn; w != nil {
		unreserve(w)
		s.wakeWorkers = append(s.wakeWorkers, w) // it took no tasks of a label it held
	}
	ls := t.labelState
	s.queue.remove(t)
	ls.queue.remove(t)
	s.queued--
	ls.queued--
	s.noteServed(ls)
	if t.heapIdx >= 0 {
		heap.Remove(&s.deadline, t.heapIdx)
	}
	s.maybeForget(t.Label, ls)
}

// ----- labels held by workers -----------------------------------------------------

func (s *Scheduler) label(name string) *labelState {
	ls := s.labels[name]
	if ls == nil {
		if n := len(s.spareLabels); n > 0 {
			ls = s.spareLabels[n-1]
			s.spareLabels = s.spareLabels[:n-1]
		} else {
			ls = &labelState{queue: taskList{on: labelLinks}, unservedPos: -1}
		}
		if l, ok := s.forgotten.take(name); ok {
			ls.est, ls.loads, ls.observed = l.est, l.loads, true
		}
		s.labels[name] = ls
	}
	return ls
}

// maybeForget drops a label's state when nothing refers to it, so that a stream of
// one-off labels cannot grow the scheduler without bound. Its learned durations go to
// s.forgotten, bounded, for when it returns; its arrival gap goes (see learned).
func (s *Scheduler) maybeForget(name string, ls *labelState) {
	if ls.holders == 0 && ls.queued == 0 {
		if ls.observed {
			s.forgotten.put(name, learned{est: ls.est, loads: ls.loads})
		}
		delete(s.labels, name)
		*ls = labelState{idle: workerSet{items: ls.idle.items[:0]}, all: workerSet{items: ls.all.items[:0]},
			queue: taskList{on: labelLinks}, unservedPos: -1} // nothing queued: not unserved
		s.spareLabels = append(s.spareLabels, ls)
	}
}

func (s *Scheduler) addHeld(w *worker, label string, pending bool) {
	ls := s.label(label)
	s.useTick++
	var h *heldLabel
	if n := len(s.spareHeld); n > 0 {
		h = s.spareHeld[n-1]
		s.spareHeld = s.spareHeld[:n-1]
	} else {
		h = new(heldLabel)
	}
	*h = heldLabel{label: label, lastUse: s.useTick, pending: pending, idlePos: -1, allPos: -1, state: ls, loadedAt: s.now}
	w.held = append(w.held, h)
	ls.holders++
	ls.all.add(&h.allPos, w)
	if w.accepting {
		ls.active++
		s.noteServed(ls)
	}
	if w.freePos >= 0 {
		ls.idle.add(&h.idlePos, w)
	}
}

// doom marks a label whose load failed while a task still uses it: it leaves the
// idle set and the active count now, and w's entry goes when the last task ends.
func (s *Scheduler) doom(w *worker, h *heldLabel) {
	if h.doomed {
		return
	}
	if w.accepting {
		h.state.active--
		s.lostHolder(h.state, h.label)
	}
	h.doomed = true
	if h.idlePos >= 0 {
		h.state.idle.remove(h.idlePos)
	}
}

// undoom takes back doom: the worker reports the label loaded after all.
func (s *Scheduler) undoom(w *worker, h *heldLabel) {
	h.doomed = false
	if w.accepting {
		h.state.active++
		s.noteServed(h.state)
	}
	if w.freePos >= 0 {
		h.state.idle.add(&h.idlePos, w)
	}
}

func (s *Scheduler) dropHeld(w *worker, i int) {
	h := w.held[i]
	if h.idlePos >= 0 {
		h.state.idle.remove(h.idlePos)
	}
	if w.accepting && !h.doomed {
		h.state.active--
		s.lostHolder(h.state, h.label)
	}
	h.state.all.remove(h.allPos)
	h.state.holders--
	if h.state.holders == 0 && h.state.queued > 0 {
		// Its queued tasks may have waited only for this copy (its backend no longer
		// lists the label): the sweep looks at them again.
		s.sweepUnloadable = true
	}
	last := len(w.held) - 1
	w.held[i] = w.held[last]
	w.held[last] = nil
	w.held = w.held[:last]
	s.maybeForget(h.label, h.state)
	*h = heldLabel{}
	s.spareHeld = append(s.spareHeld, h)
}

// evictionCost ranks w's labels as eviction victims; lower loses less. In order: a
// label with tasks queued for it goes last (they would need it reloaded); then one
// loaded moments ago, within two of its loads (the churn guard: evicting it now wastes
// the load just paid for); then the sole copy of a label (a replica, a cold copy of a
// label others hold, goes first); then the least recently used.
type evictionCost struct {
	queued, fresh, sole bool
	lastUse             uint64
}

func (a evictionCost) less(b evictionCost) bool {
	if a.queued != b.queued {
		return !a.queued
	}
	if a.fresh != b.fresh {
		return !a.fresh
	}
	if a.sole != b.sole {
		return !a.sole
	}
	return a.lastUse < b.lastUse
}

func (s *Scheduler) costOf(h *heldLabel) evictionCost {
	if s.cfg.Policy == PolicyRandom { // the baseline evicts plain LRU
		return evictionCost{lastUse: h.lastUse}
	}
	return evictionCost{
		queued:  h.state.queued > 0,
		fresh:   s.now.Before(h.loadedAt.Add(2 * s.statsOf(h.state).load)),
		sole:    h.state.holders == 1,
		lastUse: h.lastUse,
	}
}

// victim is the index of the label w should evict, with its cost, or -1. Neither a
// label with a running task nor a copy whose load is under way can go: the attempt
// that asked for the load may have ended (refused, or over before it), but the agent
// finishes a load it started and evicts only loaded labels, so it would unload another
// label than the one named, or wait for the load to end. LabelLoaded refills w then.
func (s *Scheduler) victim(w *worker) (int, evictionCost) {
	v, best := -1, evictionCost{}
	for i, h := range w.held {
		if h.inUse > 0 || (h.pending && h.loading) {
			continue
		}
		if c := s.costOf(h); v < 0 || c.less(best) {
			v, best = i, c
		}
	}
	return v, best
}

// lruVictim is victim without the cost, for callers that only need the index.
func (s *Scheduler) lruVictim(w *worker) int {
	v, _ := s.victim(w)
	return v
}

// refreshFree keeps the free sets and the per-label idle-holder sets true for w.
func (s *Scheduler) refreshFree(w *worker) {
	free := w.isFree()
	roomy := free && len(w.held) < w.capacity
	if free != (w.freePos >= 0) {
		if free {
			s.free.add(&w.freePos, w)
		} else {
			s.free.remove(w.freePos)
		}
		for _, h := range w.held {
			switch {
			case free && !h.doomed:
				h.state.idle.add(&h.idlePos, w)
			case !free && h.idlePos >= 0:
				h.state.idle.remove(h.idlePos)
			}
		}
	}
	if roomy != (w.roomyPos >= 0) {
		if roomy {
			s.roomy.add(&w.roomyPos, w)
		} else {
			s.roomy.remove(w.roomyPos)
		}
	}
}
