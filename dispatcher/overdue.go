package dispatcher

import (
	"sync"
	"time"
)

// overdueWheel tells synchronous producers that their task's worker overran its
// deadline by so much that it will not report back. A runtime timer per waiting
// request cost an allocation and two timer-heap operations on every task, for a safety
// net that almost never fires; instead, requests wait on one channel per second of
// wall-clock time, and the hub's tick closes the channels whose second has passed.
// A producer is answered within a second and a tick of its moment.
type overdueWheel struct {
	mu      sync.Mutex
	buckets map[int64]chan struct{} // by unix second, closed once it has passed
	swept   int64                   // every second up to and including this one is closed
}

// overdueGrace is how long after a task's deadline its producer stops waiting: the
// worker was told the deadline, so it should have answered by then.
const overdueGrace = 5 * time.Second

// closedChan is the answer for a moment that has passed already.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newOverdueWheel(now time.Time) *overdueWheel {
	return &overdueWheel{buckets: make(map[int64]chan struct{}), swept: now.Unix() - 1}
}

// after returns a channel that is closed once t has passed.
func (w *overdueWheel) after(t time.Time) <-chan struct{} {
	sec := t.Unix()
	if t.Nanosecond() > 0 {
		sec++ // the second that starts at or after t
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if sec <= w.swept {
		return closedChan
	}
	ch := w.buckets[sec]
	if ch == nil {
		ch = make(chan struct{})
		w.buckets[sec] = ch
	}
	return ch
}

// sweep closes the channels of every second up to now.
func (w *overdueWheel) sweep(now time.Time) {
	sec := now.Unix()
	w.mu.Lock()
	defer w.mu.Unlock()
	if sec <= w.swept {
		return
	}
	if sec-w.swept > int64(len(w.buckets)) { // a clock jump: walk the buckets, not the seconds
		for s, ch := range w.buckets {
			if s <= sec {
				close(ch)
				delete(w.buckets, s)
			}
		}
	} else {
		for s := w.swept + 1; s <= sec; s++ {
			if ch, ok := w.buckets[s]; ok {
				close(ch)
				delete(w.buckets, s)
			}
		}
	}
	w.swept = sec
}
