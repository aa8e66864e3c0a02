package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/rs/zerolog"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/backend"
)

var errNotLoadable = errors.New("label is not loadable on this worker")

// labelManager decides which labels the backend holds. Tasks acquire their label
// through it: a held label is pinned at once; a missing one is loaded, after evicting
// the label the dispatcher named or else the least recently used one that no task is
// using. Concurrent tasks for the same missing label share one load. A pinned label
// (a task runs on it or waits for its load) is never evicted.
//
// Loads and unloads run in their own goroutine, under the manager's context rather
// than the task's, so that a task giving up does not abort a load other tasks wait for.
type labelManager struct {
	backend  backend.Backend
	capacity int
	loadable map[string]struct{} // nil means any label
	ctx      context.Context     // loads and unloads run under it
	log      zerolog.Logger
	// emit sends a label event to the dispatcher. It is called with mu held, so that
	// events and hello snapshots are ordered; it must not block.
	emit func(*pb.LabelEvent)
	// onJoin and onWait, when set (tests), are called each time an acquire starts
	// waiting for a load another task started, and for room.
	onJoin, onWait func(label string)
	// metrics counts loads; nil means none. Set before the first acquire.
	metrics *Metrics

	loads sync.WaitGroup // load goroutines in flight

	mu        sync.Mutex
	entries   map[string]*labelEntry           // loading and loaded labels; len counts against capacity
	unloading map[string]struct{}              // labels being unloaded; their room is handed over already
	recency   *simplelru.LRU[string, struct{}] // loaded labels, least recently used first
	changed   chan struct{}                    // made by a waiter; closed and cleared whenever room may have appeared
	// freeing counts the unloads of labels given up as lost (labelLease.lost), whose
	// room no load has taken over: until the unload succeeds it is not free, since a
	// failed one puts the label back.
	freeing int
	// confirmOnKeep holds labels being unloaded that an attempt named for eviction and
	// has sent its result since: if the unload fails, the dispatcher hears LOADED.
	confirmOnKeep map[string]struct{}
}

// labelEntry is a loading or loaded label. Fields other than done are guarded by
// labelManager.mu; err is written before done is closed and read only after.
type labelEntry struct {
	loaded bool
	pins   int // tasks running on the label or waiting for its load
	// lost: a task's Run said the backend no longer holds the label while other
	// tasks still used it. It is off the books but for its room and their pins (no
	// hit, not listed, EVICTED sent), and the last of them to let go drops it (see
	// labelLease.lost).
	lost bool
	done chan struct{} // closed when the load ends, either way
	err  error         // why the load failed
	// lease is what every acquire of this entry returns: a lease holds nothing of the
	// task's own, and one per task was an allocation per task.
	lease labelLease
}

// newEntry makes the entry of label, with its lease.
func (m *labelManager) newEntry(label string, e labelEntry) *labelEntry {
	p := &e
	p.lease = labelLease{m: m, label: label, e: p}
	return p
}

// taskRef names the task that caused a load, for logs.
type taskRef struct {
	id      string
	attempt uint32
}

// acquireInfo says how a task got its label.
type acquireInfo struct {
	miss    bool          // this task's acquire started the load
	joined  bool          // this task waited for a load another task started
	evicted string        // label unloaded to make room for this task's load
	wait    time.Duration // time spent waiting for the label; zero on a plain hit
}

// labelLease pins a loaded label until release.
type labelLease struct {
	m     *labelManager
	label string
	e     *labelEntry
}

func (l *labelLease) release() { l.m.unpin(l.label, l.e) }

// lost gives back a lease on a label the backend no longer holds: Run said
// backend.ErrNotLoaded (Triton restarted and could not load it again). Once no other
// task runs on it, the label leaves the books as an eviction does (EVICTED), so that
// the dispatcher stops sending its tasks here as hits and the room is free for
// another label; it is unloaded first, in case a reload by another task put it back.
//
// While other tasks run on it, it leaves the books at once but for its room, which
// the last of them frees however it ends: EVICTED goes out now (this task's result
// says load_failed only if it was not cancelled meanwhile), the next hello leaves it
// out, and a task that comes for it meanwhile waits to load it again (acquire), no
// hit on a label the backend does not hold. Else the dispatcher would send its tasks
// here as hits for as long as a task on it ran, a hung one for ever.
func (l *labelLease) lost() {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	e := l.e
	if m.entries[l.label] != e || e.pins == 0 {
		return
	}
	e.pins--
	switch {
	case e.pins == 0:
		m.dropLostLocked(l.label, e.lost)
	case !e.lost:
		e.lost = true
		m.recency.Remove(l.label)
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_EVICTED, Label: l.label})
		m.log.Warn().Str("event", "label_lost").Str("label", l.label).Int("tasks_on_it", e.pins).
			Msg("backend lost the label; dropped, it is unloaded once the tasks still on it end")
	}
}

// dropLostLocked takes label, lost and no longer used, off the books and unloads it,
// reporting EVICTED once the unload is done unless announced says lost did already.
// Its room is not free until then: a failed unload puts the label back (keepLocked),
// and then an announced label is confirmed LOADED, as one a hello left out while
// unloading is. Caller holds mu.
func (m *labelManager) dropLostLocked(label string, announced bool) {
	delete(m.entries, label)
	m.recency.Remove(label)
	m.unloading[label] = struct{}{}
	if announced {
		if m.confirmOnKeep == nil {
			m.confirmOnKeep = make(map[string]struct{})
		}
		m.confirmOnKeep[label] = struct{}{}
	}
	m.freeing++
	m.loads.Add(1)
	go func() {
		defer m.loads.Done()
		_, err := m.unload(label, "", !announced)
		m.mu.Lock()
		defer m.mu.Unlock()
		m.freeing--
		if err != nil {
			m.keepLocked(label)
			return
		}
		m.broadcastLocked() // its room is free only now
	}()
}

func newLabelManager(ctx context.Context, b backend.Backend, capacity int, loadable []string, log zerolog.Logger, emit func(*pb.LabelEvent)) *labelManager {
	recency, err := simplelru.NewLRU[string, struct{}](capacity, nil)
	if err != nil {
		panic(err) // capacity is validated to be at least 1
	}
	m := &labelManager{
		backend:   b,
		capacity:  capacity,
		ctx:       ctx,
		log:       log,
		emit:      emit,
		entries:   make(map[string]*labelEntry),
		unloading: make(map[string]struct{}),
		recency:   recency,
	}
	m.loadable = loadableSet(loadable)
	return m
}

// setLoadable replaces the labels loads may start for (empty means any), when the
// backend's repository changed, and calls then (if not nil) before any acquire can see
// the change.
func (m *labelManager) setLoadable(loadable []string, then func()) {
	set := loadableSet(loadable)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadable = set
	if then != nil {
		then()
	}
}

// loadableSet is a set of labels; nil (any label) for none.
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

// adopt records labels the backend holds at startup, least recently used first. Those
// beyond capacity are unloaded.
func (m *labelManager) adopt(ctx context.Context, loaded []string) error {
	m.mu.Lock()
	var extra []string
	for _, l := range loaded {
		switch {
		case m.entries[l] != nil:
		case len(m.entries)+m.freeing < m.capacity:
			done := make(chan struct{})
			close(done)
			m.entries[l] = m.newEntry(l, labelEntry{loaded: true, done: done})
			m.recency.Add(l, struct{}{})
		default:
			extra = append(extra, l)
		}
	}
	m.mu.Unlock()
	for _, l := range extra {
		m.log.Info().Str("label", l).Msg("unloading a label beyond capacity found at startup")
		if err := m.backend.Unload(ctx, l); err != nil {
			return fmt.Errorf("unload %q: %w", l, err)
		}
	}
	return nil
}

// snapshot calls fn with the loaded labels, least recently used first, while no label
// event can be emitted: events emitted after fn returns describe changes fn did not see.
// A label being unloaded is left out; should its unload fail and the label stay, LOADED
// is sent then (confirmOnKeep), since the hello fn builds did not list it.
func (m *labelManager) snapshot(fn func(held []string)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for l := range m.unloading {
		if m.confirmOnKeep == nil {
			m.confirmOnKeep = make(map[string]struct{})
		}
		m.confirmOnKeep[l] = struct{}{}
	}
	fn(m.recency.Keys())
}

// held returns the loaded labels, least recently used first.
func (m *labelManager) held() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recency.Keys()
}

// confirmHeld sends a LOADED event for label if it is loaded: a correction for a
// dispatcher that believes it gone. While label is being unloaded (for an attempt
// that gave up waiting), the event is sent if the unload fails and the label stays.
func (m *labelManager) confirmHeld(label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[label]; e != nil && e.loaded && !e.lost {
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: label})
		return
	}
	if _, ok := m.unloading[label]; ok {
		if m.confirmOnKeep == nil {
			m.confirmOnKeep = make(map[string]struct{})
		}
		m.confirmOnKeep[label] = struct{}{}
	}
}

// wait blocks until every load and unload started so far has ended.
func (m *labelManager) wait() { m.loads.Wait() }

// acquire returns a lease on label once it is loaded, loading it if need be. evictHint
// is the label the dispatcher wants unloaded to make room; it is honoured when that
// label is loaded and unused, and otherwise the least recently used unused label goes
// when there is no room. With no room and every label in use, acquire waits for one to
// be released. It returns ctx's error if ctx ends first, or the load's error.
func (m *labelManager) acquire(ctx context.Context, label, evictHint string, task taskRef) (*labelLease, acquireInfo, error) {
	var info acquireInfo
	// When the task began to wait: read once the label is found not at hand, since a
	// plain hit waits for nothing and most tasks are hits.
	var start time.Duration
	waited := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, info, err // never start a load for a task that is over
		}
		m.mu.Lock()
		if e := m.entries[label]; e != nil && e.lost {
			// The backend lost it and tasks still run on it: wait until the last lets
			// go and its unload ends, then load it again, a miss.
			if !waited {
				start = monotonic()
			}
			waited = true
			if err := m.waitForLocked(ctx, label); err != nil {
				return nil, info, err
			}
			continue
		}
		if e := m.entries[label]; e != nil {
			e.pins++
			if e.loaded {
				m.recency.Get(label)
				m.mu.Unlock()
				if waited {
					info.wait = monotonic() - start
				}
				return &e.lease, info, nil
			}
			if !waited {
				start = monotonic()
			}
			info.joined = true
			m.mu.Unlock()
			if m.onJoin != nil {
				m.onJoin(label)
			}
			return m.awaitLoad(ctx, label, e, info, start)
		}
		// Checked only before a load: a label the backend no longer lists (its model
		// left the repository) still runs tasks while it stays loaded.
		if m.loadable != nil {
			if _, ok := m.loadable[label]; !ok {
				m.mu.Unlock()
				return nil, info, fmt.Errorf("%w: %q", errNotLoadable, label)
			}
		}
		if !waited {
			start = monotonic()
		}
		if _, ok := m.unloading[label]; ok {
			waited = true
			if err := m.waitLocked(ctx); err != nil {
				return nil, info, err
			}
			continue
		}
		victim, ok := m.pickVictimLocked(evictHint)
		if !ok {
			waited = true
			if err := m.waitForLocked(ctx, label); err != nil {
				return nil, info, err
			}
			continue
		}
		// Pinned for this task from the start: until it runs, the label must neither
		// be evicted once loaded nor, failed and forgotten, be loaded again for it.
		e := m.newEntry(label, labelEntry{done: make(chan struct{}), pins: 1})
		m.entries[label] = e
		if victim != "" {
			delete(m.entries, victim)
			m.recency.Remove(victim)
			m.unloading[victim] = struct{}{}
		}
		info.miss, info.evicted = true, victim
		m.loads.Add(1)
		go m.load(label, e, victim, task)
		m.mu.Unlock()
		return m.awaitLoad(ctx, label, e, info, start)
	}
}

// awaitLoad waits for the load of entry e, which the caller has pinned, and returns a
// lease on it, the load's error, or ctx's error (unpinning e).
func (m *labelManager) awaitLoad(ctx context.Context, label string, e *labelEntry, info acquireInfo, start time.Duration) (*labelLease, acquireInfo, error) {
	select {
	case <-e.done:
		info.wait = monotonic() - start
		if e.err != nil {
			if errors.As(e.err, new(*evictError)) {
				info.evicted = "" // it is still loaded; confirmKept tells the dispatcher
			}
			return nil, info, e.err
		}
		m.mu.Lock()
		m.recency.Get(label)
		m.mu.Unlock()
		return &e.lease, info, nil
	case <-ctx.Done():
		m.unpin(label, e)
		return nil, info, ctx.Err()
	}
}

// pickVictimLocked chooses the label to unload before a new load: the hint when it is
// loaded and unused, else nothing while there is room, else the least recently used
// unused label. ok is false when there is no room and every label is in use.
func (m *labelManager) pickVictimLocked(hint string) (victim string, ok bool) {
	if e := m.entries[hint]; hint != "" && e != nil && e.loaded && e.pins == 0 {
		return hint, true
	}
	if len(m.entries)+m.freeing < m.capacity {
		return "", true
	}
	for _, l := range m.recency.Keys() {
		if m.entries[l].pins == 0 {
			return l, true
		}
	}
	return "", false
}

// waitForLocked is waitLocked for a task that needs label, which tests observe
// (onWait).
func (m *labelManager) waitForLocked(ctx context.Context, label string) error {
	if m.onWait != nil {
		m.onWait(label)
	}
	return m.waitLocked(ctx)
}

// waitLocked releases mu and waits until room may have appeared or ctx ends.
func (m *labelManager) waitLocked(ctx context.Context) error {
	if m.changed == nil {
		m.changed = make(chan struct{})
	}
	ch := m.changed
	m.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// broadcastLocked wakes every waiter. With none, it costs nothing: most tasks end with
// an unpin that would otherwise make a channel for nobody.
func (m *labelManager) broadcastLocked() {
	if m.changed != nil {
		close(m.changed)
		m.changed = nil
	}
}

func (m *labelManager) unpin(label string, e *labelEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[label] != e || e.pins == 0 {
		return
	}
	e.pins--
	switch {
	case e.pins > 0:
	case e.lost: // an earlier task found it gone from the backend
		m.dropLostLocked(label, true)
	default:
		m.broadcastLocked()
	}
}

// load unloads victim (if any) and then loads label, settling entry e.
func (m *labelManager) load(label string, e *labelEntry, victim string, task taskRef) {
	defer m.loads.Done()
	var unloadDur time.Duration
	if victim != "" {
		var err error
		if unloadDur, err = m.evict(victim, label); err != nil {
			// The victim still holds the room this load was to use: loading anyway
			// would hold one label more than capacity. Like a load that never reached
			// the backend, it is not the label's failure; the task runs elsewhere.
			m.mu.Lock()
			e.err = &loadError{label: label, err: &evictError{label: victim, err: err}}
			delete(m.entries, label)
			m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_EVICTED, Label: label})
			m.keepLocked(victim)
			close(e.done)
			m.mu.Unlock()
			m.log.Warn().Err(err).Str("event", "label_load_failed").Str("task_id", task.id).
				Str("label", label).Str("evict_label", victim).Msg("label not loaded: no room, the label to evict could not be unloaded")
			return
		}
	}

	m.mu.Lock()
	m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADING, Label: label})
	m.mu.Unlock()
	start := time.Now()
	err := m.backend.Load(m.ctx, label)
	loadDur := time.Since(start)
	m.metrics.labelLoaded(label, err, loadDur)

	m.mu.Lock()
	switch {
	case errors.Is(err, backend.ErrUnavailable):
		// The load never reached the backend: not the label's failure (the dispatcher
		// counts those against it everywhere), only a label this worker does not hold.
		e.err = &loadError{label: label, err: err}
		delete(m.entries, label)
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_EVICTED, Label: label})
	case err != nil:
		e.err = &loadError{label: label, err: err}
		delete(m.entries, label)
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOAD_FAILED, Label: label, Error: frameText(err.Error()), DurationUs: loadDur.Microseconds()})
	default:
		e.loaded = true
		m.recency.Add(label, struct{}{})
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: label, DurationUs: loadDur.Microseconds()})
	}
	close(e.done)
	m.broadcastLocked()
	m.mu.Unlock()

	if err != nil {
		m.log.Warn().Err(err).Str("event", "label_load_failed").Str("task_id", task.id).
			Str("label", label).Float64("load_ms", millis(loadDur)).Msg("label load failed")
		return
	}
	ev := m.log.Info().Str("event", "label_miss").Str("task_id", task.id).Uint32("attempt", task.attempt).Str("label", label)
	if victim != "" {
		ev = ev.Str("evicted_label", victim).Float64("unload_ms", millis(unloadDur))
	}
	ev.Float64("load_ms", millis(loadDur)).Msg("label miss")
}

// evict unloads label, which has left entries for unloading, and tells the dispatcher
// it is gone. forLabel is the label whose load it makes room for, if any.
//
// When the unload fails and the backend may still hold the label (any error but
// backend.ErrUnloading), it returns that error and leaves label in unloading; the
// caller must then call keepLocked.
func (m *labelManager) evict(label, forLabel string) (time.Duration, error) {
	return m.unload(label, forLabel, true)
}

// unload is evict, telling the dispatcher (EVICTED) only when announce is set: not
// for a lost label it was told of already.
func (m *labelManager) unload(label, forLabel string, announce bool) (time.Duration, error) {
	start := time.Now()
	err := m.backend.Unload(m.ctx, label)
	d := time.Since(start)
	if err != nil && !errors.Is(err, backend.ErrUnloading) {
		m.log.Error().Err(err).Str("label", label).Str("for_label", forLabel).Float64("unload_ms", millis(d)).
			Msg("unload failed; the label stays counted as loaded")
		return d, err
	}
	m.mu.Lock()
	delete(m.unloading, label)
	delete(m.confirmOnKeep, label)
	if announce {
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_EVICTED, Label: label, DurationUs: d.Microseconds()})
	}
	m.broadcastLocked()
	m.mu.Unlock()
	switch {
	case err != nil:
		// Under way: the backend's next load waits until the room is free.
		m.log.Warn().Err(err).Str("label", label).Str("for_label", forLabel).Float64("unload_ms", millis(d)).
			Msg("unload not finished; the label is dropped")
	default:
		m.log.Debug().Str("label", label).Str("for_label", forLabel).Float64("unload_ms", millis(d)).Msg("label evicted")
	}
	return d, nil
}

// keepLocked puts back label, whose unload failed, as loaded and unused: the backend
// may still hold it, so it goes on counting against capacity, and a later eviction
// tries again. The dispatcher is not told it is gone.
func (m *labelManager) keepLocked(label string) {
	delete(m.unloading, label)
	done := make(chan struct{})
	close(done)
	m.entries[label] = m.newEntry(label, labelEntry{loaded: true, done: done})
	// Most recently used, so that the next eviction tries the other labels first
	// rather than fail on this one again.
	m.recency.Add(label, struct{}{})
	if _, ok := m.confirmOnKeep[label]; ok {
		delete(m.confirmOnKeep, label)
		m.emit(&pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: label})
	}
	m.broadcastLocked()
}

// evictError is a load that did not happen because the label it was to replace could
// not be unloaded.
type evictError struct {
	label string
	err   error
}

func (e *evictError) Error() string {
	return fmt.Sprintf("no room: unloading %q to make room failed: %v", e.label, e.err)
}
func (e *evictError) Unwrap() error { return e.err }

// loadError is a label load that failed; the task's result says so (load_failed), so
// that the dispatcher runs the task elsewhere.
type loadError struct {
	label string
	err   error
}

func (e *loadError) Error() string { return fmt.Sprintf("load label %q: %v", e.label, e.err) }
func (e *loadError) Unwrap() error { return e.err }

// millis is d in float milliseconds, to the microsecond.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
