package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// The peer designs the simulator compares ours with. They implement Router from their
// published descriptions, simply (they scan the fleet; they are baselines, not
// production code).

// peerWorker is a worker as the peers track it.
type peerWorker struct {
	id       string
	capacity int
	slots    int
	running  int
	labels   []string // least recently used first
	inUse    map[string]int
	local    []*scheduler.Task // ray-like: requests queued at this replica
}

func (w *peerWorker) holds(label string) bool {
	for _, l := range w.labels {
		if l == label {
			return true
		}
	}
	return false
}

func (w *peerWorker) free() bool { return w.running < w.slots }

// start runs t on w, loading its label (evicting the least recently used label not in
// use) when w does not hold it. It returns false when every label of a full w is in use.
func (w *peerWorker) start(t *scheduler.Task, out *scheduler.Outcome) bool {
	a := scheduler.Assignment{Task: t, WorkerID: w.id}
	if !w.touch(t.Label) {
		if len(w.labels) >= w.capacity {
			victim := -1
			for i, l := range w.labels {
				if w.inUse[l] == 0 {
					victim = i
					break
				}
			}
			if victim < 0 {
				return false
			}
			a.EvictLabel = w.labels[victim]
			w.labels = append(w.labels[:victim], w.labels[victim+1:]...)
		}
		w.labels = append(w.labels, t.Label)
		a.Load = true
	}
	w.running++
	w.inUse[t.Label]++
	out.Assigned = append(out.Assigned, a)
	return true
}

// touch moves a held label to most recently used; false when not held.
func (w *peerWorker) touch(label string) bool {
	for i, l := range w.labels {
		if l == label {
			copy(w.labels[i:], w.labels[i+1:])
			w.labels[len(w.labels)-1] = label
			return true
		}
	}
	return false
}

type peerBase struct {
	rng     *rand.Rand
	workers []*peerWorker
	byID    map[string]*peerWorker
	queue   []*scheduler.Task // the common FIFO
	out     scheduler.Outcome
}

func newPeerBase(seed uint64) peerBase {
	return peerBase{rng: rand.New(rand.NewPCG(seed, 2)), byID: map[string]*peerWorker{}}
}

func (p *peerBase) reset() *scheduler.Outcome {
	p.out.Assigned, p.out.Failed = p.out.Assigned[:0], p.out.Failed[:0]
	return &p.out
}

func (p *peerBase) AddWorker(spec scheduler.WorkerSpec) (*scheduler.Outcome, error) {
	out := p.reset()
	if _, ok := p.byID[spec.ID]; ok {
		return out, fmt.Errorf("worker %s exists", spec.ID)
	}
	w := &peerWorker{id: spec.ID, capacity: spec.MaxLabels, slots: spec.Slots, inUse: map[string]int{},
		labels: append([]string(nil), spec.Labels...)}
	p.workers = append(p.workers, w)
	p.byID[spec.ID] = w
	return out, nil
}

func (p *peerBase) release(workerID string, t *scheduler.Task) (*peerWorker, error) {
	w := p.byID[workerID]
	if w == nil || w.inUse[t.Label] == 0 {
		return nil, fmt.Errorf("task %s not running on %s", t.ID, workerID)
	}
	w.running--
	w.inUse[t.Label]--
	return w, nil
}

// randomOf picks uniformly among the workers that pass keep.
func (p *peerBase) randomOf(keep func(*peerWorker) bool) *peerWorker {
	var pick *peerWorker
	n := 0
	for _, w := range p.workers {
		if keep(w) {
			n++
			if p.rng.IntN(n) == 0 { // reservoir sampling: one pass, uniform
				pick = w
			}
		}
	}
	return pick
}

// seedGreedy is the seed's routing: a task goes to an idle worker that holds its label;
// otherwise to the common queue, where any free worker takes it and loads the label,
// evicting its least recently used one.
type seedGreedy struct{ peerBase }

func newSeedGreedy(seed uint64) *seedGreedy { return &seedGreedy{newPeerBase(seed)} }

func (g *seedGreedy) Submit(t *scheduler.Task) (*scheduler.Outcome, error) {
	out := g.reset()
	if w := g.randomOf(func(w *peerWorker) bool { return w.free() && w.holds(t.Label) }); w != nil && w.start(t, out) {
		return out, nil
	}
	// The common queue: with a free worker there, it is taken at once.
	if w := g.randomOf(func(w *peerWorker) bool { return w.free() }); w != nil && w.start(t, out) {
		return out, nil
	}
	g.queue = append(g.queue, t)
	return out, nil
}

func (g *seedGreedy) Complete(workerID string, t *scheduler.Task, _ scheduler.Observation) (*scheduler.Outcome, error) {
	out := g.reset()
	w, err := g.release(workerID, t)
	if err != nil {
		return out, err
	}
	for w.free() && len(g.queue) > 0 && w.start(g.queue[0], out) {
		g.queue = g.queue[1:]
	}
	return out, nil
}

func (g *seedGreedy) Rebalance() *scheduler.Outcome { return g.reset() }

// rayLike is Ray Serve's model multiplexing: among the replicas that hold the model and
// have queue room, power of two choices (the shorter queue wins); with no such holder,
// the replica with the fewest models loaded takes it and loads the model, evicting its
// least recently used one. Requests wait at a replica (up to maxOngoing in flight); when
// every candidate is full they wait at the router and are routed again later.
type rayLike struct{ peerBase }

// maxOngoing is Ray Serve's max_ongoing_requests per replica (running plus queued);
// its default is 5.
const maxOngoing = 5

func newRayLike(seed uint64) *rayLike { return &rayLike{newPeerBase(seed)} }

func (r *rayLike) ongoing(w *peerWorker) int { return w.running + len(w.local) }

func (r *rayLike) Submit(t *scheduler.Task) (*scheduler.Outcome, error) {
	out := r.reset()
	if !r.route(t, out) {
		r.queue = append(r.queue, t)
	}
	return out, nil
}

// route sends t to a replica's queue (starting it when a slot is free), or reports false.
func (r *rayLike) route(t *scheduler.Task, out *scheduler.Outcome) bool {
	var holders []*peerWorker
	for _, w := range r.workers {
		if w.holds(t.Label) && r.ongoing(w) < maxOngoing {
			holders = append(holders, w)
		}
	}
	var target *peerWorker
	switch len(holders) {
	case 0:
		// Nobody with room holds it: the replica with the fewest models loaded.
		for _, w := range r.workers {
			if r.ongoing(w) >= maxOngoing {
				continue
			}
			if target == nil || len(w.labels) < len(target.labels) ||
				(len(w.labels) == len(target.labels) && r.ongoing(w) < r.ongoing(target)) {
				target = w
			}
		}
		if target == nil {
			return false
		}
	case 1:
		target = holders[0]
	default:
		i := r.rng.IntN(len(holders))
		j := r.rng.IntN(len(holders) - 1)
		if j >= i {
			j++
		}
		target = holders[i]
		if r.ongoing(holders[j]) < r.ongoing(target) {
			target = holders[j]
		}
	}
	if target.free() && len(target.local) == 0 && target.start(t, out) {
		return true
	}
	target.local = append(target.local, t)
	return true
}

func (r *rayLike) Complete(workerID string, t *scheduler.Task, _ scheduler.Observation) (*scheduler.Outcome, error) {
	out := r.reset()
	w, err := r.release(workerID, t)
	if err != nil {
		return out, err
	}
	for w.free() && len(w.local) > 0 && w.start(w.local[0], out) {
		w.local = w.local[1:]
	}
	r.drain(out)
	return out, nil
}

// drain routes requests waiting at the router while replicas have room.
func (r *rayLike) drain(out *scheduler.Outcome) {
	for len(r.queue) > 0 && r.route(r.queue[0], out) {
		r.queue = r.queue[1:]
	}
}

func (r *rayLike) Rebalance() *scheduler.Outcome {
	out := r.reset()
	r.drain(out)
	return out
}
