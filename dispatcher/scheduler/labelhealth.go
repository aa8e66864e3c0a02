package scheduler

import "time"

// labelFailures is a label's recent load failures. A label with LabelFailureThreshold
// failures within LabelFailureWindow is failing until `until`: its tasks fail at once.
// After the cool-down the label is on probation: tasks run again, and one more load
// failure marks it failing again at once; a load that works forgets it.
type labelFailures struct {
	times     []time.Time // failures within the window, oldest first
	until     time.Time   // failing until then; zero when not failing
	probation bool
	lastError string
	last      time.Time // the latest failure
}

// LabelLoadFailed records that a load of label failed on a worker (its LOAD_FAILED
// event): the worker does not hold the label, and the failure counts toward
// LabelFailureThreshold. One failed load counts once, however many attempts waited
// for it; and it counts even when the attempt that started it ended first (its
// deadline passed during a slow load). It counts only for a load the worker was sent a
// task to make, or of a label it holds (a model its backend lost and reloads): one
// agent's stray events must not fail a label that the rest of the fleet serves. A
// failure that marks the label failing fails every task queued for it with
// FailLabelFailing; the attempts that waited for the load come back through LoadFailed.
func (s *Scheduler) LabelLoadFailed(workerID, label, loadError string) *Outcome {
	out := s.reset()
	w, ok := s.workers[workerID]
	if !ok {
		return s.settle(out)
	}
	if _, asked := w.loadsAsked[label]; !asked && w.find(label) < 0 {
		return s.settle(out)
	}
	if s.recordLoadFailure(label, loadError) {
		s.failQueued(label, loadError)
	}
	s.labelGone(workerID, label)
	return s.settle(out)
}

// failQueued fails every task queued for a label that has just been marked failing.
func (s *Scheduler) failQueued(label, loadError string) {
	ls := s.labels[label]
	if ls == nil {
		return
	}
	for q := ls.queue.head; q != nil; {
		next := q.byLabel.next
		s.unqueue(q)
		q.state = stateDone
		s.out.Failed = append(s.out.Failed, Failure{Task: q, Reason: FailLabelFailing, LoadError: loadError})
		q = next
	}
}

// LoadFailed takes back an attempt whose label failed to load on the worker. The
// task never goes back to that worker; it runs elsewhere (bounded by MaxAttempts, then
// FailLoad), unless the label is failing (LabelLoadFailed counted the failure), which
// fails it with FailLabelFailing. loadError is kept as the reason.
func (s *Scheduler) LoadFailed(workerID string, t *Task, loadError string) (*Outcome, error) {
	out := s.reset()
	w, i, err := s.runningOn(workerID, t)
	if err != nil {
		return out, err
	}
	s.takeBack(w, i, t, false) // the label is dropped or doomed below
	t.excluded = append(t.excluded, workerID)
	// The worker does not hold the label, whether or not its LabelGone came first.
	if i := w.find(t.Label); i >= 0 {
		s.dropOrDoom(w, i)
	}
	if s.failingNow(t.Label, s.now) != nil {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailLabelFailing, LoadError: loadError})
		s.failQueued(t.Label, loadError) // tasks requeued since the label was marked
		s.fill(w)
		return s.settle(out), nil
	}
	// A deadline passed during the failed load wins, as in failSpent: the producer ran
	// out of time, whatever else happened.
	if !t.Deadline.IsZero() && !t.Deadline.After(s.now) {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailDeadline})
		s.fill(w)
		return s.settle(out), nil
	}
	if t.Attempt >= s.cfg.MaxAttempts {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailLoad, LoadError: loadError})
		s.fill(w)
		return s.settle(out), nil
	}
	// Failed on every connected worker that could take it: nowhere left to go, so the
	// load error now, unless the fleet is still changing (then the sweep decides).
	if !s.anyWorkerMayTake(t) && s.now.Sub(s.fleetChanged) >= s.cfg.FleetSettle {
		t.state = stateDone
		out.Failed = append(out.Failed, Failure{Task: t, Reason: FailLoad, LoadError: loadError})
		s.fill(w)
		return s.settle(out), nil
	}
	s.enqueue(t, true)
	// The workers it may still go to can leave: the sweep looks at it again then.
	s.noteExcluded(t, loadError)
	s.sweepUnloadable = true
	s.expireDue() // its deadline may have passed during the failed load
	if t.state == stateQueued {
		s.place(t)
	}
	s.fill(w)
	s.offerFree()
	return s.settle(out), nil
}

// excludedTask is a task requeued after a failed load, with the load's error.
type excludedTask struct {
	t         *Task
	loadError string
}

// noteExcluded adds t to excludedQueued, or updates its entry with the newer error.
func (s *Scheduler) noteExcluded(t *Task, loadError string) {
	for i := range s.excludedQueued {
		if s.excludedQueued[i].t == t {
			s.excludedQueued[i].loadError = loadError
			return
		}
	}
	s.excludedQueued = append(s.excludedQueued, excludedTask{t, loadError})
}

// anyWorkerMayTake says whether a connected worker t is not excluded from holds or can
// load t's label, whether or not it is free now. Walks every worker: only for tasks
// whose label failed to load somewhere.
func (s *Scheduler) anyWorkerMayTake(t *Task) bool {
	for _, w := range s.workers {
		if !t.excludes(w.id) && (w.find(t.Label) >= 0 || w.canLoad(t.Label)) {
			return true
		}
	}
	return false
}

// failExcluded fails the queued tasks that failed to load on every connected worker
// that could take them, with their last load error (with fail false it only looks),
// and forgets the entries of tasks no longer queued.
func (s *Scheduler) failExcluded(fail bool) {
	keep := s.excludedQueued[:0]
	for _, e := range s.excludedQueued {
		switch {
		case e.t.state != stateQueued: // assigned or finished since
		case !fail || s.anyWorkerMayTake(e.t):
			keep = append(keep, e)
		default:
			s.unqueue(e.t)
			e.t.state = stateDone
			s.out.Failed = append(s.out.Failed, Failure{Task: e.t, Reason: FailLoad, LoadError: e.loadError})
		}
	}
	clear(s.excludedQueued[len(keep):])
	s.excludedQueued = keep
}

// recordLoadFailure counts a failure and reports whether it marks the label failing.
func (s *Scheduler) recordLoadFailure(label, loadError string) bool {
	now := s.now
	lf := s.failing[label]
	if lf == nil {
		lf = &labelFailures{}
		s.failing[label] = lf
	}
	lf.lastError, lf.last = loadError, now
	keep := lf.times[:0]
	for _, at := range lf.times {
		if now.Sub(at) < s.cfg.LabelFailureWindow {
			keep = append(keep, at)
		}
	}
	lf.times = append(keep, now)
	if lf.probation || len(lf.times) >= s.cfg.LabelFailureThreshold {
		lf.until = now.Add(s.cfg.LabelFailureCooldown)
		lf.times = lf.times[:0]
		lf.probation = true // whatever happens next, one failure after the cool-down trips it again
		return true
	}
	return false
}

// failingNow returns the label's failure record if the label is failing at now.
func (s *Scheduler) failingNow(label string, now time.Time) *labelFailures {
	if len(s.failing) == 0 {
		return nil
	}
	if lf := s.failing[label]; lf != nil && now.Before(lf.until) {
		return lf
	}
	return nil
}

// LabelFailing reports whether a label is failing now, until when, and its last load
// error.
func (s *Scheduler) LabelFailing(label string) (until time.Time, loadError string, failing bool) {
	if lf := s.failingNow(label, s.clock.Now()); lf != nil {
		return lf.until, lf.lastError, true
	}
	return time.Time{}, "", false
}

// pruneFailing forgets labels that have not failed for a window past their cool-down,
// so that a stream of one-off failing labels cannot grow the map without bound. The
// map holds only labels that failed recently, so a scan is cheap.
func (s *Scheduler) pruneFailing() {
	if len(s.failing) == 0 {
		return
	}
	for label, lf := range s.failing {
		if s.now.Sub(lf.last) >= s.cfg.LabelFailureCooldown+s.cfg.LabelFailureWindow {
			delete(s.failing, label)
		}
	}
}

// firstFor is the oldest task in a label's queue that may run on w: the head, unless
// the label failed to load on w for the head (then a few more are looked at).
func firstFor(q *taskList, w *worker) *Task {
	n := 0
	for t := q.head; t != nil && n < placeTries; t, n = t.byLabel.next, n+1 {
		if !t.excludes(w.id) {
			return t
		}
	}
	return nil
}
