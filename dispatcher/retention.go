package dispatcher

import (
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// retention keeps answered tasks for GET /tasks/{id} and resubmissions of their ids,
// for TaskRetention, at most TaskRetentionCount of them holding at most
// TaskRetentionBytes. Guarded by hub.mu.
//
// Records are kept in the order they were answered: lookups peek and do not refresh
// them, so the oldest entry is always the first to expire, and the hub's tick drops
// expired ones from that end. (An expirable LRU did the same with a lock, a bucket
// list and a goroutine of its own: a tenth of the dispatcher's routing cost per task.)
type retention struct {
	ttl   time.Duration
	clock scheduler.Clock
	tasks *simplelru.LRU[string, *taskRecord]
	size  int
	// bytes is what the kept records hold (retainedBytes), at most maxBytes.
	bytes, maxBytes int64
	// earlyDropAt is the answer time (Unix ns; 0: none) of the newest record dropped
	// by the count or the bytes bound: until that plus the retention, an id missing
	// here may still be answered in the journal. Atomic, so that the request path can tell "never"
	// without the hub's lock or a clock read.
	earlyDropAt atomic.Int64
}

// sweepBatch bounds the expired records dropped per tick, so that a burst of expiries
// does not hold the hub's lock for long; the rest go on later ticks, and lookups
// already treat them as gone.
const sweepBatch = 4096

func newRetention(ttl time.Duration, size int, maxBytes int64, clock scheduler.Clock) *retention {
	r := &retention{ttl: ttl, clock: clock, size: size, maxBytes: maxBytes}
	tasks, err := simplelru.NewLRU(size, func(_ string, rec *taskRecord) { r.bytes -= retainedBytes(rec) })
	if err != nil { // only for a size below one, which Config.validate refuses
		panic(err)
	}
	r.tasks = tasks
	return r
}

// retainedBytes is roughly what a kept record holds: its answer, and the record, its
// strings and the LRU's entry (a fixed 512 bytes).
func retainedBytes(rec *taskRecord) int64 {
	return int64(len(rec.result)+len(rec.errMsg)+len(rec.sched.ID)+len(rec.sched.Label)+len(rec.workerID)) + 512
}

// entryBytes is retainedBytes of the record recordFromEntry makes of e.
func entryBytes(e *journalEntry) int64 {
	return int64(len(e.Result)+len(e.Error)+len(e.ID)+len(e.Label)+len(e.WorkerID)) + 512
}

// droppedBefore notes that answers finished at or before at (unix ns) were left out
// of memory (the journal's, at start), as dropOldest notes its own.
func (r *retention) droppedBefore(at int64) {
	if at > r.earlyDropAt.Load() {
		r.earlyDropAt.Store(at)
	}
}

// droppedAny says whether the count bound has ever dropped a record.
func (r *retention) droppedAny() bool { return r.earlyDropAt.Load() != 0 }

// mayHaveDropped says whether an answer still within the retention at now may have
// been dropped from memory by the count bound.
func (r *retention) mayHaveDropped(now time.Time) bool {
	at := r.earlyDropAt.Load()
	return at != 0 && now.Sub(time.Unix(0, at)) < r.ttl
}

// add keeps an answered record; the oldest go when the count or the bytes are
// reached.
func (r *retention) add(rec *taskRecord) {
	if old, ok := r.tasks.Peek(rec.sched.ID); ok { // replaced without an eviction
		r.bytes -= retainedBytes(old)
	} else if r.tasks.Len() >= r.size {
		r.dropOldest()
	}
	r.tasks.Add(rec.sched.ID, rec)
	r.bytes += retainedBytes(rec)
	for r.bytes > r.maxBytes && r.tasks.Len() > 1 {
		r.dropOldest()
	}
}

// dropOldest drops the oldest record before its time, noting when it was answered.
func (r *retention) dropOldest() {
	_, old, ok := r.tasks.GetOldest()
	if !ok {
		return
	}
	r.droppedBefore(old.finishedAt.UnixNano())
	r.tasks.RemoveOldest()
}

// get returns the answered record under id unless its retention is over. The clock is
// read only for a record found: most lookups are fresh ids.
func (r *retention) get(id string) (*taskRecord, bool) {
	rec, ok := r.tasks.Peek(id)
	if !ok || r.expired(rec, r.clock.Now()) {
		return nil, false
	}
	return rec, true
}

// expired reports whether an answered record outlived the retention, counted from its
// answer (records recovered from the journal keep their original answer time).
func (r *retention) expired(rec *taskRecord, now time.Time) bool {
	return now.Sub(rec.finishedAt) >= r.ttl
}

// sweep drops up to sweepBatch expired records from the oldest end.
func (r *retention) sweep(now time.Time) (dropped int) {
	for dropped < sweepBatch {
		_, rec, ok := r.tasks.GetOldest()
		if !ok || !r.expired(rec, now) {
			return dropped
		}
		r.tasks.RemoveOldest()
		dropped++
	}
	return dropped
}

func (r *retention) len() int { return r.tasks.Len() }
