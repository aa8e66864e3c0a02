package scheduler

import "time"

type taskState uint8

const (
	stateNew taskState = iota
	stateQueued
	stateRunning
	// stateOverran marks a stand-in that holds the slot of an attempt its worker overran
	// (see ExpireRunning): the task itself is done, the worker has not said it stopped.
	stateOverran
	stateDone
)

// Task is one unit of work as the scheduler sees it. The owner fills the exported
// fields before Submit and reads them back from Outcomes; the rest is the scheduler's.
type Task struct {
	ID    string
	Label string
	// Deadline after which a queued task fails; zero means none.
	Deadline time.Time
	// Attempt counts the starts so far; the first assignment makes it 1. MaxAttempts
	// bounds it.
	Attempt int
	// AttemptBase is what AttemptNumber adds to Attempt. Submit sets it: 0, unless an
	// earlier run of the same id still holds a slot after it overran (see
	// ExpireRunning), in which case it is the highest attempt number such runs were given.
	// The owner keeps it with the task, as it keeps Attempt.
	AttemptBase int
	// Enqueued is when Submit was called; Started when the current attempt began.
	Enqueued time.Time
	Started  time.Time
	// Ref is the owner's handle on its own record of the task.
	Ref any

	state taskState
	// requeued marks a queued task that went back to the front of the queues (a lost,
	// refused or failed attempt): the queues hold such tasks first, then the tasks
	// queued on submission in the order they came. See appendAged.
	requeued bool
	seq      uint64
	worker   *worker
	// labelState is the label's state while the task is placed (set by Submit), queued
	// (by enqueue) or runs (by assign); stale after. The label cannot be forgotten
	// meanwhile: a queued task counts in its queue and a running one's label is held.
	// The hot paths find the label through it rather than by name in s.labels.
	labelState *labelState
	// excluded lists the workers this task's label failed to load on: the task does
	// not go back to them.
	excluded []string
	// reservedOn is the worker freeing a slot and label freeing for this queued task
	// (see worker.reservedFor), or nil. Kept here rather than on the worker, which the
	// wait estimate walks and which is better kept small.
	reservedOn *worker
	freeing    string
	// Links in the global queue and in the label's queue.
	global, byLabel links
	// heapIdx is the task's place in the scheduler's deadline heap while it is queued,
	// or in its runningDeadline heap while it runs (never both); -1 when in neither.
	heapIdx int
}

// AttemptNumber names the current attempt to its worker: Attempt, above the attempts
// of earlier runs of the id that may still be running there. A worker told a number it
// is still running takes the assignment for a duplicate and ignores it, and that run's
// late result would match the new attempt; so a run submitted while an overrun one of
// the same id holds a slot numbers its attempts after it. Only the number moves:
// MaxAttempts counts this run's starts (Attempt) alone, so the new run has as many
// starts as any other.
func (t *Task) AttemptNumber() int { return t.AttemptBase + t.Attempt }

// Queued reports whether the task is waiting in the queue.
func (t *Task) Queued() bool { return t.state == stateQueued }

// Running reports whether the task is assigned to a worker.
func (t *Task) Running() bool { return t.state == stateRunning }

func (t *Task) excludes(workerID string) bool {
	for _, id := range t.excluded {
		if id == workerID {
			return true
		}
	}
	return false
}

// WorkerID is the worker running the task, or "".
func (t *Task) WorkerID() string {
	if t.worker == nil {
		return ""
	}
	return t.worker.id
}

type worker struct {
	id        string
	capacity  int
	slots     int
	accepting bool
	held      []*heldLabel
	running   []*Task
	// loadable limits which labels the worker can load; nil means any.
	loadable map[string]struct{}
	// Positions in the scheduler's free and roomy sets, -1 when absent.
	freePos, roomyPos int
	// reservedFor is a queued task past its pass-over bound (the FIFO head in random
	// mode) that this worker could load but cannot take yet, every label it holds being
	// in use: it takes no more tasks of the task's label freeing until that label's
	// running tasks end and it can be evicted for the task. Rule 4 on a worker with more
	// slots than labels, whose labels' traffic would otherwise keep them in use for ever.
	reservedFor *Task
	// loadsAsked are the labels this worker was sent a task to load whose LOADED or
	// LOAD_FAILED has not come yet: only such a failure, or one of a label the worker
	// holds, counts toward the label's failing (LabelLoadFailed). Nil until the first.
	loadsAsked map[string]struct{}
	// evictsAsked are the labels this worker was sent a task to evict whose EVICTED has
	// not come yet (the copy left the view when the task was sent; see Unloaded).
	evictsAsked map[string]struct{}
}

// takes reports whether w may start t as far as its reservation goes: any task when it
// has none; else only a task of a label it holds and is not freeing (a load would take
// the label freed for the reserved task).
func (w *worker) takes(t *Task) bool {
	return w.reservedFor == nil || (t.Label != w.reservedFor.freeing && w.find(t.Label) >= 0)
}

func (w *worker) isFree() bool { return w.accepting && len(w.running) < w.slots }

// find is the index of the worker's entry for label (live or doomed), or -1.
func (w *worker) find(label string) int {
	for i, h := range w.held {
		if h.label == label {
			return i
		}
	}
	return -1
}

// heldOf is the worker's entry for the label whose state is ls, or nil. Comparing state
// pointers rather than names keeps it cheap on the placement hot path.
func (w *worker) heldOf(ls *labelState) *heldLabel {
	for _, h := range w.held {
		if h.state == ls {
			return h
		}
	}
	return nil
}

func (w *worker) canLoad(label string) bool {
	if w.loadable == nil {
		return true
	}
	_, ok := w.loadable[label]
	return ok
}

func (w *worker) runningIndex(t *Task) int {
	for i, r := range w.running {
		if r == t {
			return i
		}
	}
	return -1
}

// byRecency returns indexes into held, least recently used first, in dst's array
// when it has room.
func (w *worker) byRecency(dst []int) []int {
	idx := dst[:0]
	for i := range w.held {
		idx = append(idx, i)
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && w.held[idx[j]].lastUse < w.held[idx[j-1]].lastUse; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	return idx
}

// heldLabel is one label on one worker.
type heldLabel struct {
	label string
	state *labelState
	// lastUse orders labels by recency of assignment (a logical clock).
	lastUse uint64
	// loadedAt is when the label was assigned to (or announced by) the worker.
	loadedAt time.Time
	// inUse counts running tasks of this label on the worker; such a label is never
	// evicted.
	inUse int
	// pending is true between the assignment that loads the label and the first
	// result: it already counts as held, so a burst of tasks does not start a load on
	// every worker.
	pending bool
	// loading is true once the worker said it started the load a pending copy waits for.
	loading bool
	// idlePos and allPos are the worker's positions in state.idle and state.all, -1
	// when absent.
	idlePos, allPos int
	// runEst is the run time learned for this label on this worker; zero until the
	// first result (the label's estimate stands in).
	runEst time.Duration
	// doomed marks a label whose load failed while a task still used it: no new task
	// goes to it, and it is dropped when its last task ends.
	doomed bool
}

// labelState indexes one label: who holds it and who waits for it.
type labelState struct {
	// holders counts every worker entry for the label; active only those that can
	// serve it (accepting, not doomed): the cost model and placement use active.
	holders int
	active  int
	// idle holds the holders that have a free slot; all holds every holder.
	idle   workerSet
	all    workerSet
	queue  taskList // this label's FIFO, through byLabel links
	queued int
	// unservedPos is the label's place in Scheduler.unserved, -1 when absent.
	unservedPos int
	est         estimate
	// observed is true once est holds a measurement rather than the priors.
	observed bool
	// loads counts the loads measured into est.load.
	loads int
	// arrivalGap is the smoothed time between the label's submissions (valid once
	// gapSeen), the first and latest of which came at firstArrival and lastArrival
	// (since the label's state was made). It is the label's demand, for rule 2's
	// question whether its holders keep up at all.
	arrivalGap                time.Duration
	gapSeen                   bool
	firstArrival, lastArrival time.Time
}

// arrivalWeight is how much one gap between submissions moves arrivalGap: smoother than
// the durations' ewmaWeight, because gaps between random arrivals vary far more than
// load and run times do.
const arrivalWeight = 0.05

// openingBurst is how long after a label's first arrival its arrivals are one burst
// rather than a gap between tasks: a first gap of 0 (or microseconds, concurrent
// requests) would set the smoothed gap near 0 for the dozens of arrivals it takes to
// recover, and the label would look unasked for as soon as any time passed (regret).
// Its state is forgotten once no worker holds it and none of its tasks waits
// (maybeForget), so with bursty producers this recurs whenever a label evicted everywhere
// returns: simulator, ours, 1000 seeds, batch-jobs misses -4.0%, mean latency
// -2.1%; slow-loads-bursts -5.2%, -3.1% (RESULTS.md, "Bursty producers").
const openingBurst = time.Millisecond

// arrived records a submission of the label at now. (Starting afresh after a pause
// longer than a load was tried: on slow-loads it cost 37% more mean latency, the
// stretches of the labels with 400 ms loads being cut all the time.)
func (ls *labelState) arrived(now time.Time) {
	gap := now.Sub(ls.lastArrival)
	switch {
	case ls.lastArrival.IsZero():
		ls.firstArrival = now
	case ls.gapSeen:
		ls.arrivalGap += time.Duration(arrivalWeight * float64(gap-ls.arrivalGap))
	case now.Sub(ls.firstArrival) < openingBurst:
		// Still the label's first burst: no gap between its tasks measured yet.
	default:
		ls.arrivalGap, ls.gapSeen = gap, true
	}
	ls.lastArrival = now
}

// loadMeanSamples is how many of a label's first loads are averaged evenly before the
// estimate follows later loads with ewmaWeight: the first load replaces the prior, and
// one unusual load (a cold disk) is soon outweighed.
const loadMeanSamples = 5

// workerSet is an unordered set with O(1) add and remove: each member stores its
// position through the pointer it was added with.
type workerSet struct{ items []setItem }

type setItem struct {
	w   *worker
	pos *int
}

func (s *workerSet) len() int         { return len(s.items) }
func (s *workerSet) at(i int) *worker { return s.items[i].w }
func (s *workerSet) last() *worker    { return s.items[len(s.items)-1].w }
func (s *workerSet) add(pos *int, w *worker) {
	*pos = len(s.items)
	s.items = append(s.items, setItem{w, pos})
}

func (s *workerSet) remove(i int) {
	last := len(s.items) - 1
	*s.items[i].pos = -1
	if i != last {
		s.items[i] = s.items[last]
		*s.items[i].pos = i
	}
	s.items[last] = setItem{}
	s.items = s.items[:last]
}

// links are a task's neighbours in one FIFO.
type links struct{ prev, next *Task }

// taskList is an intrusive FIFO of tasks. A task sits in two at once, the global
// queue and its label's queue, through two sets of links; on picks which.
type taskList struct {
	head, tail *Task
	on         func(*Task) *links
}

func globalLinks(t *Task) *links { return &t.global }
func labelLinks(t *Task) *links  { return &t.byLabel }

func (l *taskList) pushBack(t *Task) {
	lt := l.on(t)
	lt.prev, lt.next = l.tail, nil
	if l.tail != nil {
		l.on(l.tail).next = t
	} else {
		l.head = t
	}
	l.tail = t
}

func (l *taskList) pushFront(t *Task) {
	lt := l.on(t)
	lt.prev, lt.next = nil, l.head
	if l.head != nil {
		l.on(l.head).prev = t
	} else {
		l.tail = t
	}
	l.head = t
}

func (l *taskList) remove(t *Task) {
	lt := l.on(t)
	if lt.prev != nil {
		l.on(lt.prev).next = lt.next
	} else {
		l.head = lt.next
	}
	if lt.next != nil {
		l.on(lt.next).prev = lt.prev
	} else {
		l.tail = lt.prev
	}
	lt.prev, lt.next = nil, nil
}

// deadlineHeap orders tasks that have a deadline, earliest first: the queued ones
// (Scheduler.deadline) or the running ones (Scheduler.runningDeadline).
type deadlineHeap []*Task

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].Deadline.Before(h[j].Deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *deadlineHeap) Push(x any) {
	t := x.(*Task)
	t.heapIdx = len(*h)
	*h = append(*h, t)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.heapIdx = -1
	*h = old[:len(old)-1]
	return t
}

// estimate holds learned durations for a label.
type estimate struct{ load, run time.Duration }

// ewmaWeight is how much one observation moves an estimate: recent enough to follow a
// model that got slower, smooth enough that one outlier does not flip decisions.
const ewmaWeight = 0.2

func ewma(old, sample time.Duration) time.Duration {
	return old + time.Duration(ewmaWeight*float64(sample-old))
}

func (s *Scheduler) stats(label string) estimate { return s.statsOf(s.labels[label]) }

// statsOf is stats for a label whose state the caller has at hand (nil: unknown).
func (s *Scheduler) statsOf(ls *labelState) estimate {
	if ls != nil && ls.observed {
		return ls.est
	}
	return estimate{load: s.cfg.LoadTimePrior, run: s.cfg.RunTimePrior}
}

func (s *Scheduler) observe(label string, obs Observation) {
	ls := s.labels[label]
	if ls == nil {
		return
	}
	if !ls.observed {
		ls.est = estimate{load: s.cfg.LoadTimePrior, run: s.cfg.RunTimePrior}
		ls.observed = true
	}
	if obs.Loaded && obs.LoadTime > 0 {
		ls.loads++
		if ls.loads <= loadMeanSamples {
			ls.est.load += (obs.LoadTime - ls.est.load) / time.Duration(ls.loads)
		} else {
			ls.est.load = ewma(ls.est.load, obs.LoadTime)
		}
	}
	if obs.RunTime > 0 {
		ls.est.run = ewma(ls.est.run, obs.RunTime)
	}
}
