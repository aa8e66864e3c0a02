package scheduler

// learned is what the scheduler keeps of a forgotten label: the load and run times it
// measured (est, and how many loads went into est.load). They are the model's own and
// still hold when the label returns, unlike its arrival gap, which is recent demand:
// restored, the gap counts as measured, each task of a returning burst pulls it toward
// 0 (see openingBurst), and the label soon looks unasked for (simulator, ours, 1000
// seeds, keeping it too: batch-jobs misses +3.3%, slow-loads-bursts +2.5%; RESULTS.md,
// "A forgotten label's learned load and run times").
type learned struct {
	est   estimate
	loads int
}

// forgotten keeps the learned estimates of the labels forgotten last (maybeForget), at
// most size of them: the least recently forgotten goes first. A label's state goes
// when no worker holds it and none of its tasks waits, so that a stream of one-off
// labels cannot grow the scheduler; without this, every label evicted everywhere came
// back to the priors (a 4 s model taken for a 400 ms one; simulator, ours: mean latency
// on fleet -47%, slow-loads -11%, slow-loads-bursts -17%, but batch-jobs +0.6%, whose
// loads sit at the prior on the edge of a decision: RESULTS.md). Entries are recycled
// in a slice linked by index, so that forgetting a label on the load path allocates
// nothing once the slice is full (golang-lru's simplelru allocates an entry per Add).
//
// An entry is added when a label is forgotten and taken out when it returns (the live
// state then holds the estimates): nothing else touches one, so the order of
// forgetting is the order of use.
type forgotten struct {
	size  int
	index map[string]int
	slots []forgottenSlot
	// newest and oldest are the ends of the list of entries in use, free the first
	// slot taken out and not reused; -1 when none.
	newest, oldest, free int
}

type forgottenSlot struct {
	label string
	learned
	// newer and older link the entries in use; older also links the free slots.
	newer, older int
}

func newForgotten(size int) forgotten {
	return forgotten{size: size, newest: -1, oldest: -1, free: -1}
}

func (f *forgotten) len() int { return len(f.index) }

// put records a label's estimates as the most recently forgotten, dropping the least
// recently forgotten when full.
func (f *forgotten) put(label string, l learned) {
	if f.size <= 0 {
		return
	}
	if i, ok := f.index[label]; ok { // not met: a returning label's entry is taken out
		f.unlink(i)
		f.slots[i].learned = l
		f.pushNewest(i)
		return
	}
	if f.index == nil {
		f.index = make(map[string]int)
	}
	var i int
	switch {
	case f.free >= 0:
		i = f.free
		f.free = f.slots[i].older
	case len(f.slots) < f.size:
		i = len(f.slots)
		f.slots = append(f.slots, forgottenSlot{})
	default:
		i = f.oldest
		f.unlink(i)
		delete(f.index, f.slots[i].label)
	}
	f.slots[i] = forgottenSlot{label: label, learned: l}
	f.index[label] = i
	f.pushNewest(i)
}

// take returns a label's estimates and drops its entry.
func (f *forgotten) take(label string) (learned, bool) {
	i, ok := f.index[label]
	if !ok {
		return learned{}, false
	}
	l := f.slots[i].learned
	f.unlink(i)
	delete(f.index, label)
	f.slots[i] = forgottenSlot{older: f.free} // drop the name: it would keep the string alive
	f.free = i
	return l, true
}

func (f *forgotten) pushNewest(i int) {
	f.slots[i].newer, f.slots[i].older = -1, f.newest
	if f.newest >= 0 {
		f.slots[f.newest].newer = i
	} else {
		f.oldest = i
	}
	f.newest = i
}

func (f *forgotten) unlink(i int) {
	s := &f.slots[i]
	if s.newer >= 0 {
		f.slots[s.newer].older = s.older
	} else {
		f.newest = s.older
	}
	if s.older >= 0 {
		f.slots[s.older].newer = s.newer
	} else {
		f.oldest = s.newer
	}
	s.newer, s.older = -1, -1
}
