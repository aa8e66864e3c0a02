package scheduler

// WorkerView is a read-only snapshot of a worker for ops endpoints.
type WorkerView struct {
	ID        string
	Labels    []string // least recently used first
	Slots     int
	Running   int
	MaxLabels int
	Accepting bool
}

// Worker returns a snapshot of one worker.
func (s *Scheduler) Worker(id string) (WorkerView, bool) {
	v, _, ok := s.AppendWorker(nil, id)
	return v, ok
}

// AppendWorker is Worker with the labels appended to buf, which it returns; the view's
// Labels is the appended part, capped so that appending to it leaves buf alone. The
// ops endpoints snapshot every worker under the dispatcher's lock, where no task is
// routed: with 10,000 workers, two allocations per worker made that walk the stall.
func (s *Scheduler) AppendWorker(buf []string, id string) (WorkerView, []string, bool) {
	w, ok := s.workers[id]
	if !ok {
		return WorkerView{}, buf, false
	}
	v := WorkerView{ID: w.id, Slots: w.slots, Running: len(w.running), MaxLabels: w.capacity, Accepting: w.accepting}
	var order [16]int // a worker holds a few labels; more only costs an allocation
	start := len(buf)
	for _, i := range w.byRecency(order[:]) {
		buf = append(buf, w.held[i].label)
	}
	if len(buf) > start {
		v.Labels = buf[start:len(buf):len(buf)]
	}
	return v, buf, true
}
