package dispatcher

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// hub owns the routing state. Everything below mu is guarded by it; the scheduler
// is called only with mu held, and an Outcome is acted on before mu is released, so
// assignments reach each worker's send queue in the order they were decided.
type hub struct {
	cfg   Config
	log   zerolog.Logger
	clock scheduler.Clock

	mu       sync.Mutex
	sched    *scheduler.Scheduler
	active   map[string]*taskRecord // tasks not finished yet
	workers  map[string]*workerConn // connected workers by id
	closing  bool                   // shutdown began: no new tasks or workers
	idle     chan struct{}          // closed when closing and no task is active
	finished *retention             // answered tasks, for GET /tasks/{id} and resubmissions
	// running is, once shutdown began, the journaled tasks that were running then and
	// still have no answer: one that comes back to the queue is let go to the journal
	// (releaseRequeued) rather than hold the shutdown.
	running []*taskRecord
	// released are the journaled tasks let go to the journal at shutdown, still shown
	// by GET /tasks/{id} (queued: the next start runs them) while the shutdown lasts.
	released map[string]*taskRecord
	met      *metrics // per-label children guarded by mu; see metrics.go
	// journal keeps asynchronous tasks across restarts; nil when Config.DataDir is
	// empty. It locks itself.
	journal *journal
	// forgets counts journal records deleted for refused submissions (forgetRefused).
	// Written under mu.
	forgets atomic.Uint64

	// assignment and envelope are reused (under mu) to encode assignment frames.
	assignment pb.TaskAssignment
	envelope   pb.Envelope

	views fleetViews // GET /workers?detail=true and GET /labels; locks itself
}

func newHub(cfg Config) (*hub, error) {
	sched, err := scheduler.New(cfg.Scheduler, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	h := &hub{
		cfg:      cfg,
		log:      cfg.Logger.With().Str("component", "hub").Logger(),
		clock:    cfg.Clock,
		sched:    sched,
		active:   make(map[string]*taskRecord),
		workers:  make(map[string]*workerConn),
		finished: newRetention(cfg.TaskRetention, cfg.TaskRetentionCount, cfg.TaskRetentionBytes, cfg.Clock),
	}
	h.met = newMetrics(h, cfg.MetricsMaxLabels)
	h.envelope.Body = &pb.Envelope_Assignment{Assignment: &h.assignment}
	return h, nil
}

// submitError carries the HTTP status of a refused submission.
type submitError struct {
	status int
	msg    string
}

func (e *submitError) Error() string { return e.msg }

var errShuttingDown = &submitError{http.StatusServiceUnavailable, "dispatcher is shutting down"}

// idConflict refuses a task under an id that is in flight or answered for a task
// with another label, type or parameters: handing it that task's answer would tell
// its producer that work it did not ask for is its own.
func idConflict(id string) error {
	return &submitError{http.StatusConflict, "task id " + id +
		" was used for a different task (label/type/parameters differ) within the last --task-retention; use a new id"}
}

// resubmitted returns known, the record an id resubmitted with fingerprint fp is
// answered with, or idConflict when known is another task.
func resubmitted(known *taskRecord, fp uint64) (*taskRecord, error) {
	if !sameTask(known.fingerprint, fp) {
		return nil, idConflict(known.sched.ID)
	}
	return known, nil
}

// submit registers a task and routes it. A task id that is in flight or answered
// within the retention returns that task's record instead of running it again, or
// idConflict when that task had another label, type or parameters; fresh says the
// record is this submission's own. With a journal, an asynchronous task is on disk
// before submit returns.
func (h *hub) submit(spec taskSpec) (got *taskRecord, fresh bool, err error) {
	now := h.clock.Now()
	if spec.id == "" {
		// Random, not a counter: every answer shows the id, and a producer that could
		// guess the next one could submit it first and be handed another producer's
		// task, as a resubmission of its own.
		spec.id = rand.Text()
	}
	timeout := spec.timeout
	if timeout == 0 {
		timeout = h.cfg.TaskTimeout
	}
	rec := &taskRecord{
		taskType:     spec.taskType,
		params:       spec.params,
		returnResult: spec.returnResult,
		created:      now,
		fingerprint:  taskFingerprint(spec.label, spec.taskType, spec.params),
		done:         make(chan struct{}),
	}
	rec.sched = scheduler.Task{ID: spec.id, Label: spec.label, Deadline: now.Add(timeout), Ref: rec}
	if h.journal == nil || spec.returnResult {
		if r := h.journaledAnswer(spec.id); r != nil {
			r, err := resubmitted(r, rec.fingerprint)
			return r, false, err
		}
		got, err = h.admit(rec, true)
		return got, got == rec, err
	}
	for {
		var again bool
		got, again, err = h.submitJournaled(spec, rec, now)
		if !again {
			return got, got == rec, err
		}
	}
}

// submitJournaled is submit's path for an asynchronous task with a journal. again says
// that the journal record this submission found, and would have relied on, was deleted
// by a refused submission of the same id before this one was admitted: submit starts
// over, and the next write creates the record anew.
func (h *hub) submitJournaled(spec taskSpec, rec *taskRecord, now time.Time) (got *taskRecord, again bool, err error) {
	// Refusals first: a task the queue bounds refuse must not cost two synced commits
	// (accept, then forget) when the dispatcher is already overloaded. admit checks
	// again under the lock.
	if err := h.precheck(rec); err != nil {
		return nil, false, err
	}
	// Read before the write: a deletion counted after it may have taken the record
	// that the write found (see forgetRefused).
	forgets := h.forgets.Load()
	// Journal first, outside the lock: the task must be on disk before anything can
	// run it, and the disk must not hold up other tasks.
	prev, created, err := h.journal.accept(rec.entry(), now)
	if err != nil {
		// A disk that is full or failing for a while: the producer should retry (503 with
		// Retry-After), not treat the task as broken.
		h.log.Error().Err(err).Str("task_id", spec.id).Msg("journal write failed")
		return nil, false, &submitError{http.StatusServiceUnavailable, "journal write failed: " + err.Error()}
	}
	if h.cfg.onJournalAccept != nil {
		h.cfg.onJournalAccept(spec.id, created)
	}
	rec.journaled = true
	if !created {
		if prev.Finished != 0 {
			r := h.known(spec.id)
			if r == nil {
				r = recordFromEntry(*prev) // answered, and dropped from memory since
			}
			r, err := resubmitted(r, rec.fingerprint)
			return r, false, err
		}
		if !sameTask(prev.Fingerprint, rec.fingerprint) {
			// Another task pending under the id: its run, or a concurrent submission of
			// other content, which one of the two must not be told is its own.
			return nil, false, idConflict(spec.id)
		}
		// Pending in the journal: in flight here (recovered at start, or accepted by a
		// concurrent submission of the id), and admit returns that run, unless the
		// submission that wrote the record was refused and deleted it meanwhile.
		// Whichever run admit returns answers that record, under its Created.
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.forgets.Load() != forgets {
			return nil, true, nil
		}
		rec.journalRun = prev.Created
		got, err := h.admitLocked(rec, true)
		if err == nil && got != rec {
			h.adoptLocked(got, prev.Created) // a synchronous run of the id: it answers the record
		}
		return got, false, err
	}
	got, err = h.admit(rec, true)
	if err != nil || (got == rec && rec.refusedAtAdmit) {
		// Refused, by admit or as it was routed (no worker can load its label, the label
		// is failing): no record stays to run the task again at the next start, and the
		// id is free for the retry Retry-After invites.
		if h.cfg.onJournalForget != nil {
			h.cfg.onJournalForget(spec.id)
		}
		h.forgetRefused(rec)
		if err != nil {
			return nil, false, err
		}
		return got, false, nil
	}
	if got != rec { // the id was in flight or answered without a journal record
		h.mu.Lock()
		h.adoptLocked(got, rec.run())
		h.mu.Unlock()
	}
	return got, false, nil
}

// forgetRefused deletes the journal record of rec, a task that this submission wrote
// and the hub then refused, unless another submission of the id got in meanwhile: that
// one was told 202 on the strength of this record. The check runs under the hub's lock
// inside the delete's transaction, so no submission is admitted between it and the
// delete; one admitted after it sees forgets move and writes the record again. A run
// of other content under the id (rec was refused as a conflict) relies on no record
// of rec's: a submission that found it was refused as a conflict too.
func (h *hub) forgetRefused(rec *taskRecord) {
	id, run := rec.sched.ID, rec.run()
	err := h.journal.forget(id, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		if known := h.knownLocked(id); known != nil && sameTask(known.fingerprint, rec.fingerprint) {
			h.adoptLocked(known, run)
			return false
		}
		h.forgets.Add(1)
		return true
	})
	if err != nil {
		h.log.Error().Err(err).Str("task_id", id).Msg("journal: refused task not removed; it runs after a restart")
	}
}

// adoptLocked makes rec, which holds an id the journal has a pending record of, answer
// that record, written by the run created at run: at once if it is answered, else
// when it is. Caller holds mu.
func (h *hub) adoptLocked(rec *taskRecord, run int64) {
	queued := rec.journaled && rec.run() == run // its answer is, or will be, that record's
	rec.journaled, rec.journalRun = true, run
	if rec.finished() && !queued {
		h.journal.complete(*rec.entry())
	}
}

// precheck refuses, before any disk write, a submission that admit would refuse.
func (h *hub) precheck(rec *taskRecord) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return errShuttingDown
	}
	if known := h.knownLocked(rec.sched.ID); known != nil {
		_, err := resubmitted(known, rec.fingerprint) // nil: admit returns the known record
		return err
	}
	label := rec.sched.Label
	if h.sched.QueuedTasks() >= h.cfg.MaxQueued {
		return &submitError{http.StatusTooManyRequests, fmt.Sprintf("queue full: %d tasks waiting", h.cfg.MaxQueued)}
	}
	if err := h.labelQueueFull(label); err != nil {
		return err
	}
	return nil
}

// admit registers rec and routes it, or returns the record already holding its id.
// limit applies the queue bound (tasks recovered from the journal were accepted
// before and are not refused).
func (h *hub) admit(rec *taskRecord, limit bool) (*taskRecord, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.admitLocked(rec, limit)
}

// admitLocked is admit for a caller holding mu.
func (h *hub) admitLocked(rec *taskRecord, limit bool) (*taskRecord, error) {
	id := rec.sched.ID
	if h.closing {
		return nil, errShuttingDown
	}
	if prev := h.knownLocked(id); prev != nil {
		return resubmitted(prev, rec.fingerprint)
	}
	if limit && h.sched.QueuedTasks() >= h.cfg.MaxQueued {
		return nil, &submitError{http.StatusTooManyRequests, fmt.Sprintf("queue full: %d tasks waiting", h.cfg.MaxQueued)}
	}
	if limit {
		if err := h.labelQueueFull(rec.sched.Label); err != nil {
			return nil, err
		}
	}
	h.active[id] = rec
	h.met.of(rec).received.Inc()
	start := h.met.scheduleStart()
	out, err := h.sched.Submit(&rec.sched)
	h.met.scheduled(start)
	if err != nil { // cannot happen for a fresh record; keep the books straight anyway
		delete(h.active, id)
		return nil, err
	}
	// A producer's task refused as it is routed is answered, but not kept as its id's
	// answer (see finish). Recovered tasks (limit false) were accepted with a 202: their
	// answer is kept for GET /tasks/{id}.
	rec.admitting = limit
	h.apply(out)
	rec.admitting = false
	rec.refusedAtAdmit = rec.finished()
	return rec, nil
}

// openJournal opens the journal in cfg.DataDir and takes over its tasks.
func (h *hub) openJournal() error {
	j, err := openJournal(h.cfg.DataDir, journalOptions{
		retention:   h.cfg.TaskRetention,
		lockTimeout: h.cfg.JournalLockTimeout,
		log:         h.cfg.Logger.With().Str("component", "journal").Logger(),
		writeErrors: h.met.journalWriteErrors,
		retryAfter:  h.cfg.journalRetry,
		writeFault:  h.cfg.journalWriteFault,
		now:         h.clock.Now,
	})
	if err != nil {
		return err
	}
	l, err := j.load(h.clock.Now(), h.cfg.TaskRetentionCount, h.cfg.TaskRetentionBytes)
	if err != nil {
		j.close()
		return fmt.Errorf("read journal: %w", err)
	}
	h.journal = j
	requeued, expired := h.recover(l)
	h.log.Info().Str("data_dir", h.cfg.DataDir).Int("requeued", requeued).Int("expired", expired).
		Int("answers", len(l.answered)).Bool("answers_left_on_disk", l.droppedAt != 0).Msg("journal opened")
	return nil
}

// sweepJournal deletes the expired answers from the journal, JournalSweepLimit per
// transaction.
func (h *hub) sweepJournal() {
	n, err := h.journal.sweep(h.clock.Now(), h.cfg.JournalSweepLimit)
	if err != nil {
		h.log.Error().Err(err).Msg("journal sweep")
		return
	}
	if n > 0 {
		h.log.Debug().Int("deleted", n).Msg("journal: expired answers deleted")
	}
}

// known returns the record in flight or answered under id, or nil.
func (h *hub) known(id string) *taskRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.knownLocked(id)
}

// knownLocked is known for a caller holding mu.
func (h *hub) knownLocked(id string) *taskRecord {
	if rec := h.active[id]; rec != nil {
		return rec
	}
	if rec, ok := h.finished.get(id); ok {
		return rec
	}
	return nil
}

// recover takes over a journal's tasks at start: answers within the retention are
// served again (from memory those load kept, from the journal the rest), pending tasks
// run again with their original deadlines, and pending tasks whose deadline passed
// while no dispatcher ran are failed with 504.
//
// Each pending task is charged one start for every dispatcher that died holding it
// (it may have been running, and may be what killed it), so that --max-attempts bounds
// a task that crashes the dispatcher too; one that has used them up fails with 503.
// The charge is written once here, for all tasks in one transaction, rather than a
// count written at every start: that would cost a journal write per assignment. A
// graceful shutdown writes the exact starts of the tasks it lets go (markReleased),
// and those are not charged again.
func (h *hub) recover(l loaded) (requeued, expired int) {
	// Oldest answer first, as the retention expects them.
	for _, e := range slices.Backward(l.answered) {
		h.finished.add(recordFromEntry(e))
	}
	h.finished.droppedBefore(l.droppedAt)
	pending := l.pending
	// In the order they were accepted: the journal is keyed by id.
	sort.Slice(pending, func(i, j int) bool { return pending[i].Created < pending[j].Created })
	now := h.clock.Now()
	charged := make([]journalEntry, 0, len(pending))
	for _, e := range pending {
		if !e.Released {
			e.Attempts++
		}
		e.Released = false
		charged = append(charged, e)
	}
	if err := h.journal.rewritePending(charged); err != nil {
		// The charges are lost as a crash before this point would lose them: the tasks
		// still run.
		h.log.Error().Err(err).Int("tasks", len(charged)).Msg("journal: starts of recovered tasks not written")
	}
	for _, e := range charged {
		rec := &taskRecord{taskType: e.TaskType, params: e.Params, created: time.Unix(0, e.Created),
			fingerprint: e.Fingerprint, done: make(chan struct{}), journaled: true}
		rec.sched = scheduler.Task{ID: e.ID, Label: e.Label, Deadline: time.Unix(0, e.Deadline), Attempt: e.Attempts, Ref: rec}
		if !now.Before(rec.sched.Deadline) {
			h.mu.Lock()
			h.met.failedTask(rec, failDeadline)
			h.finish(rec, statusFailed, http.StatusGatewayTimeout, "deadline passed while the dispatcher was down")
			h.mu.Unlock()
			expired++
			continue
		}
		if e.Attempts >= h.cfg.Scheduler.MaxAttempts {
			h.mu.Lock()
			h.met.failedTask(rec, failWorkersLost)
			h.finish(rec, statusFailed, http.StatusServiceUnavailable, fmt.Sprintf(
				"%s: started or held by %d dispatchers that stopped without an answer (--max-attempts %d)",
				scheduler.FailAttempts, e.Attempts, h.cfg.Scheduler.MaxAttempts))
			h.mu.Unlock()
			expired++
			continue
		}
		if _, err := h.admit(rec, false); err != nil {
			h.log.Error().Err(err).Str("task_id", e.ID).Msg("journal: recovered task not admitted")
			continue
		}
		requeued++
	}
	return requeued, expired
}

// lookup finds a task in flight or answered.
func (h *hub) lookup(id string) (taskView, bool) {
	h.mu.Lock()
	rec := h.knownLocked(id)
	if rec == nil {
		rec = h.released[id]
	}
	if rec != nil {
		v := rec.view()
		h.mu.Unlock()
		return v, true
	}
	h.mu.Unlock()
	if rec := h.journaledAnswer(id); rec != nil {
		return rec.view(), true
	}
	return taskView{}, false
}

// journaledAnswer returns a journaled answer under id that the memory's count bound
// dropped before its retention was over; nil when there is none (or no journal, or
// nothing was dropped early: the common case costs no disk read).
func (h *hub) journaledAnswer(id string) *taskRecord {
	if h.journal == nil || !h.finished.droppedAny() { // the request path: one atomic load
		return nil
	}
	now := h.clock.Now()
	if !h.finished.mayHaveDropped(now) {
		return nil
	}
	h.mu.Lock()
	known := h.knownLocked(id) != nil
	h.mu.Unlock()
	if known {
		return nil
	}
	e, ok, err := h.journal.get(id, now) // outside the lock: a disk read
	if err != nil {
		h.log.Error().Err(err).Str("task_id", id).Msg("journal read")
	}
	if !ok {
		return nil
	}
	return recordFromEntry(e)
}

// apply acts on a scheduler outcome. Caller holds mu.
func (h *hub) apply(out *scheduler.Outcome) {
	released, withdrew := false, false
	for _, a := range out.Assigned {
		rec := a.Task.Ref.(*taskRecord)
		if rec.finished() {
			// Finished records are read without the lock; the scheduler must have let
			// go of them (Abandon, Cancel) before they were answered.
			h.log.Error().Str("task_id", a.Task.ID).Msg("assignment of a finished task")
			continue
		}
		if h.closing && rec.journaled && h.sched.Withdraw(a) {
			// A journaled task back from its worker (lost, or refusing it) during
			// shutdown goes to the journal for the next start, as releaseRequeued lets
			// go of one still queued; the scheduler may have placed it on another
			// worker in the same outcome. Withdrawn before its assignment goes out, it
			// was not started again, and the worker's view is as the worker has it:
			// no load of the task's label, no eviction for it.
			h.releaseLocked(rec)
			released, withdrew = true, true
			continue
		}
		rec.workerID = a.WorkerID
		rec.queueTime = a.Task.Started.Sub(a.Task.Enqueued) // submit to the start of this attempt
		h.met.queueWait.Observe(rec.queueTime.Seconds())
		wc := h.workers[a.WorkerID]
		if wc == nil {
			// The scheduler only knows connected workers; a miss here is a bug.
			h.log.Error().Str("worker_id", a.WorkerID).Str("task_id", a.Task.ID).Msg("assignment to unknown worker")
			continue
		}
		h.assignment = pb.TaskAssignment{
			TaskId:         a.Task.ID,
			Attempt:        uint32(a.Task.AttemptNumber()), // after an overrun run's of the id, if one is held
			TaskType:       rec.taskType,
			Label:          a.Task.Label,
			ParametersJson: rec.params,
			DeadlineUnixMs: ceilMilli(a.Task.Deadline),
			EvictLabel:     a.EvictLabel,
		}
		b, err := frame.Encode(nil, &h.envelope)
		h.assignment = pb.TaskAssignment{} // hold no task's parameters
		if err != nil {
			h.log.Error().Err(err).Str("task_id", a.Task.ID).Msg("encode assignment")
			continue
		}
		if a.Load {
			h.logLoad(a, rec)
		}
		// A full queue disconnects the worker; its tasks come back when it is removed.
		wc.send(b)
	}
	for _, f := range out.Failed {
		rec := f.Task.Ref.(*taskRecord)
		if f.Task.Attempt == 0 { // failed in the queue: all of its time was queue time
			rec.queueTime = h.clock.Now().Sub(f.Task.Enqueued)
		}
		status, msg := http.StatusGatewayTimeout, f.Reason.String()
		switch f.Reason {
		case scheduler.FailAttempts:
			status = http.StatusServiceUnavailable
		case scheduler.FailLoad:
			status, msg = http.StatusBadGateway, msg+": "+f.LoadError
		case scheduler.FailLabelFailing:
			// 503: the label may work again after the cool-down.
			status = http.StatusServiceUnavailable
			if until, _, ok := h.sched.LabelFailing(f.Task.Label); ok && !rec.finished() {
				rec.retryAt = until
			}
			msg = fmt.Sprintf("label %q is failing to load (%d failures within %v; cool-down %v): %s", f.Task.Label,
				h.cfg.Scheduler.LabelFailureThreshold, h.cfg.Scheduler.LabelFailureWindow, h.cfg.Scheduler.LabelFailureCooldown, f.LoadError)
		case scheduler.FailNoWorkerCanLoad:
			// 503: a worker whose backend has the label may connect later.
			status = http.StatusServiceUnavailable
			msg = fmt.Sprintf("no connected worker can load label %q: none of the %d workers' backends lists it (a model name misspelt, or not in the model repository?)",
				f.Task.Label, len(h.workers))
		case scheduler.FailOverrun:
			msg = h.overran(f)
		}
		h.met.failedTask(rec, failReasonOf(f.Reason))
		h.finish(rec, statusFailed, status, msg)
	}
	if len(h.running) > 0 || released {
		h.releaseRequeued()
	}
	if withdrew {
		// The slots the withdrawn assignments took are free: another queued task may
		// take one now rather than at the next tick. out is not read again.
		h.apply(h.sched.Expire())
	}
}

// logLoad logs, at debug, an assignment that loads its label: every load is a label
// miss, and which rule made it (with the delay slack the scheduler allowed holders)
// is what a run with more misses than expected is read by. Caller holds mu.
func (h *hub) logLoad(a scheduler.Assignment, rec *taskRecord) {
	if e := h.log.Debug(); e.Enabled() {
		e.Str("task_id", a.Task.ID).Str("worker_id", a.WorkerID).Str("label", a.Task.Label).
			Str("evict_label", a.EvictLabel).Stringer("reason", a.Reason).Int("attempt", a.Task.AttemptNumber()).
			Float64("queued_ms", ms(rec.queueTime)).Float64("delay_slack_ms", ms(h.sched.DelaySlack())).
			Msg("label load assigned")
	}
}

// releaseRequeued lets go of the journaled tasks that were running when shutdown
// began and are queued again (their worker lost, or refusing them), as beginShutdown
// does with queued ones. Every requeue reaches apply, which calls this. Caller holds
// mu.
func (h *hub) releaseRequeued() {
	kept := h.running[:0]
	for _, rec := range h.running {
		switch {
		case rec.finished() || h.active[rec.sched.ID] != rec: // answered, or let go
		case h.sched.Cancel(&rec.sched): // false unless queued
			h.releaseLocked(rec)
		default:
			kept = append(kept, rec)
		}
	}
	clear(h.running[len(kept):])
	h.running = kept
	h.idleCheck()
}

// finish gives a task its one answer. Caller holds mu.
func (h *hub) finish(rec *taskRecord, status string, httpStatus int, errMsg string) {
	if rec.finished() {
		return
	}
	rec.status = status
	rec.httpStatus = httpStatus
	rec.errMsg = errMsg
	rec.finishedAt = h.clock.Now()
	if status == statusCompleted {
		// Counted before the answer is released (as failures are, by finish's callers):
		// a producer that reads /metrics after its answer finds its task counted.
		h.met.completedTask(rec, rec.finishedAt.Sub(rec.created))
	}
	// Retained records keep the answer, not the request: parameters can be large.
	rec.params = nil
	delete(h.active, rec.sched.ID)
	if !rec.admitting {
		if rec.journaled {
			h.journal.complete(*rec.entry())
		}
		h.finished.add(rec)
	}
	// else refused as its producer submitted it (the label failing, no worker can load
	// it): the producer is told now, and a retry of the id after Retry-After runs the
	// task rather than get this refusal back for the whole retention. The submission
	// deletes its journal record (forgetRefused).
	close(rec.done)
	h.idleCheck()
}

// idleCheck closes idle once shutdown began and no task is active. Caller holds mu.
func (h *hub) idleCheck() {
	if h.closing && len(h.active) == 0 && h.idle != nil {
		close(h.idle)
		h.idle = nil
	}
}

// overrunGrace is how long past a task's deadline its worker may take to answer
// before the hub answers for it: the worker was told the deadline and stops the
// attempt by itself, so a correct one has answered by then.
const overrunGrace = 5 * time.Second

// tick fails queued tasks whose deadline passed and running ones whose worker overran
// it by overrunGrace, lets free workers reconsider tasks that have waited too long,
// and drops answers whose retention is over.
func (h *hub) tick() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.apply(h.sched.Expire())
	h.apply(h.sched.ExpireRunning(overrunGrace))
	h.apply(h.sched.Rebalance())
	h.finished.sweep(h.clock.Now())
}

// overran deals with an attempt whose worker overran the task's deadline by
// overrunGrace and has not answered (a backend call that ignores cancellation, a hung
// agent): the task is answered 504 now, rather than stay running for ever, and the
// worker is told to cancel the attempt. Its slot stays busy in the scheduler until
// the worker answers (endOverrun) or leaves. It returns the answer's error. Caller
// holds mu.
func (h *hub) overran(f scheduler.Failure) string {
	h.log.Warn().Str("task_id", f.Task.ID).Str("worker_id", f.WorkerID).Str("label", f.Task.Label).
		Int("attempt", f.Task.AttemptNumber()).Time("deadline", f.Task.Deadline).
		Msg("worker overran the task's deadline and did not answer; task failed with 504, attempt cancelled")
	if wc := h.workers[f.WorkerID]; wc != nil {
		h.sendControl(wc, &pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{
			TaskId: f.Task.ID, Attempt: uint32(f.Task.AttemptNumber()), Reason: "deadline overrun: the dispatcher answered the task"}}})
	}
	return fmt.Sprintf("deadline exceeded: worker %q overran it by %v and did not answer; its attempt was cancelled",
		f.WorkerID, overrunGrace)
}

// endOverrun takes a result of an attempt its worker overran (see overran): the task
// has its answer already, so the result only frees the attempt's slot and teaches the
// scheduler its load and run times, as onResult's would. It reports false for a
// result of no such attempt. Caller holds mu.
func (h *hub) endOverrun(wc *workerConn, res *pb.TaskResult) bool {
	obs := scheduler.Observation{
		Loaded:   res.GetLabelMiss() && !res.GetLoadFailed(),
		LoadTime: reportedDuration(res.GetLoadDurationUs()),
		Failed:   !res.GetOk() || res.GetRefused() || res.GetLoadFailed(),
	}
	if !res.GetRefused() && !res.GetLoadFailed() { // as onResult: only a run that Complete would see
		obs.RunTime = reportedDuration(res.GetRunDurationUs())
	}
	out, ok := h.sched.EndOverrun(wc.id, res.GetTaskId(), int(res.GetAttempt()), obs)
	if !ok {
		return false
	}
	h.log.Info().Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Uint32("attempt", res.GetAttempt()).
		Float64("run_ms", float64(obs.RunTime.Microseconds())/1000).
		Msg("late result of an overrun attempt dropped; its slot is free again")
	h.apply(out)
	return true
}

// viewOf snapshots a record under the lock.
func (h *hub) viewOf(rec *taskRecord) taskView {
	h.mu.Lock()
	defer h.mu.Unlock()
	return rec.view()
}

// addWorker registers a connection after its hello. A live connection with the same
// id is replaced: its running tasks are requeued and it is closed with
// CLOSE_CODE_REPLACED, on which the agent gives up, so two agents misconfigured with
// one id do not take turns.
//
// welcome (nil: none) is queued here, under the lock that also registers the worker:
// whoever reads the Welcome and then takes the lock (GET /workers) finds the worker
// registered, and the assignments the scheduler makes below follow it. A dispatcher
// shutting down sends no Welcome, only the SHUTDOWN close.
func (h *hub) addWorker(wc *workerConn, hello *pb.Hello, welcome []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return &Disconnect{Code: pb.CloseCode_CLOSE_CODE_SHUTDOWN, Reason: "dispatcher is shutting down"}
	}
	if welcome != nil {
		wc.send(welcome)
	}
	if old := h.workers[wc.id]; old != nil {
		h.removeLocked(old)
		old.close(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_REPLACED, Reason: "replaced by a newer connection with the same worker id"})
		h.log.Warn().Str("worker_id", wc.id).Msg("worker id reconnected; closing the older connection")
	}
	h.workers[wc.id] = wc
	wc.loadable = sortedLabels(hello.GetLoadableLabels())
	out, err := h.sched.AddWorker(scheduler.WorkerSpec{
		ID:          wc.id,
		MaxLabels:   int(hello.GetMaxLabels()),
		Slots:       int(hello.GetSlots()),
		Labels:      hello.GetHeldLabels(),
		Unavailable: hello.GetUnavailable(),
		Loadable:    hello.GetLoadableLabels(),
	})
	if err != nil {
		delete(h.workers, wc.id)
		return err
	}
	h.met.connects.Inc()
	h.apply(out)
	return nil
}

// removeWorker forgets a connection that ended; a no-op when it was replaced.
func (h *hub) removeWorker(wc *workerConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers[wc.id] == wc {
		h.removeLocked(wc)
	}
}

func (h *hub) removeLocked(wc *workerConn) {
	delete(h.workers, wc.id)
	out, err := h.sched.RemoveWorker(wc.id)
	if err != nil {
		h.log.Error().Err(err).Str("worker_id", wc.id).Msg("remove worker")
		return
	}
	for _, t := range out.Assigned {
		if t.Task.Attempt > 1 {
			h.log.Info().Str("task_id", t.Task.ID).Str("worker_id", t.WorkerID).Int("attempt", t.Task.Attempt).Msg("task from a lost worker reassigned")
		}
	}
	h.apply(out)
}

// onResult records a worker's result. Results for attempts the dispatcher no longer
// waits for (the task was requeued, or the id is unknown) are dropped: the producer
// gets exactly one answer.
func (h *hub) onResult(wc *workerConn, res *pb.TaskResult) {
	// Checked and copied before taking the lock: it needs no routing state, and it is
	// the costliest step here.
	var result json.RawMessage
	if res.GetOk() {
		result = resultJSON(res.GetResult())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers[wc.id] != wc {
		return
	}
	rec := h.active[res.GetTaskId()]
	if rec == nil || rec.sched.WorkerID() != wc.id || uint32(rec.sched.AttemptNumber()) != res.GetAttempt() {
		if h.endOverrun(wc, res) {
			return
		}
		h.log.Debug().Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Uint32("attempt", res.GetAttempt()).Msg("stale result dropped")
		return
	}
	if res.GetRefused() {
		out, err := h.sched.Requeue(wc.id, &rec.sched)
		if err != nil {
			h.log.Error().Err(err).Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Msg("requeue refused task")
			return
		}
		h.log.Debug().Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Str("reason", res.GetError()).Msg("worker refused task; requeued")
		h.apply(out)
		return
	}
	if res.GetLoadFailed() {
		out, err := h.sched.LoadFailed(wc.id, &rec.sched, res.GetError())
		if err != nil {
			h.log.Error().Err(err).Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Msg("load failed")
			return
		}
		h.log.Debug().Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Str("label", rec.sched.Label).Str("reason", res.GetError()).Msg("label load failed; task runs elsewhere")
		// A failed load is still a load the task paid for: in its answer, if this was
		// its last attempt, and in the load metrics.
		h.recordLoad(rec, res, reportedDuration(res.GetLoadDurationUs()))
		h.apply(out)
		return
	}
	loadTime := reportedDuration(res.GetLoadDurationUs())
	runTime := reportedDuration(res.GetRunDurationUs())
	start := h.met.scheduleStart()
	out, err := h.sched.Complete(wc.id, &rec.sched, scheduler.Observation{Loaded: res.GetLabelMiss(), LoadTime: loadTime, RunTime: runTime, Failed: !res.GetOk()})
	h.met.scheduled(start)
	if err != nil {
		h.log.Error().Err(err).Str("worker_id", wc.id).Str("task_id", res.GetTaskId()).Msg("complete")
		return
	}
	h.recordLoad(rec, res, loadTime)
	rec.runTime = runTime
	switch {
	case res.GetOk():
		rec.result = result
		h.finish(rec, statusCompleted, http.StatusOK, "")
	case res.GetDeadlineExceeded() || (!rec.sched.Deadline.IsZero() && !h.clock.Now().Before(rec.sched.Deadline)):
		h.met.failedTask(rec, failDeadline)
		h.finish(rec, statusFailed, http.StatusGatewayTimeout, "deadline exceeded while running: "+res.GetError())
	default:
		h.met.failedTask(rec, failWorkerError)
		h.finish(rec, statusFailed, http.StatusBadGateway, "worker error: "+res.GetError())
	}
	h.apply(out)
}

// recordLoad adds what an attempt's result says of its label's load to the task's
// record (its answer's label_miss and load_ms) and to the metrics. Caller holds h.mu.
func (h *hub) recordLoad(rec *taskRecord, res *pb.TaskResult, loadTime time.Duration) {
	rec.labelMiss = rec.labelMiss || res.GetLabelMiss()
	rec.loadTime += loadTime
	h.met.result(rec, res, loadTime)
}

// maxReportedDuration bounds a load or run time a worker reports: a task's deadline
// is at most 24 h (timeout_ms), and a larger figure is a broken or lying worker's.
const maxReportedDuration = 24 * time.Hour

// reportedDuration is a worker's duration in microseconds, kept within 0 and
// maxReportedDuration: past about 292 years the multiplication wrapped, and the
// learned load and run times and the answer's load_ms took whatever came out.
func reportedDuration(us int64) time.Duration {
	return time.Duration(min(max(us, 0), maxReportedDuration.Microseconds())) * time.Microsecond
}

func (h *hub) onLabelEvent(wc *workerConn, ev *pb.LabelEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers[wc.id] != wc {
		return
	}
	switch ev.GetKind() {
	case pb.LabelEvent_KIND_LOADING:
		h.sched.LabelLoading(wc.id, ev.GetLabel())
	case pb.LabelEvent_KIND_LOADED:
		h.apply(h.sched.LabelLoaded(wc.id, ev.GetLabel()))
	case pb.LabelEvent_KIND_LOAD_FAILED:
		// One event per failed load: it counts toward the label's failure threshold.
		h.apply(h.sched.LabelLoadFailed(wc.id, ev.GetLabel(), ev.GetError()))
	case pb.LabelEvent_KIND_EVICTED:
		if h.sched.Unloaded(wc.id, ev.GetLabel()) {
			h.met.label(ev.GetLabel()).evictions.Inc()
		}
		h.apply(h.sched.LabelGone(wc.id, ev.GetLabel()))
	}
}

// sendControl encodes a control frame (Cancel, Drain) and queues it for wc.
func (h *hub) sendControl(wc *workerConn, env *pb.Envelope) {
	b, err := frame.Encode(nil, env)
	if err != nil {
		h.log.Error().Err(err).Str("worker_id", wc.id).Msg("encode control frame")
		return
	}
	wc.send(b)
}

// drain asks a worker to stop taking tasks and finish those it runs; it reports false
// for a worker that is not connected. The worker leaves the routing at once rather
// than when its status frame comes back, so that nothing new is sent its way.
func (h *hub) drain(workerID, reason string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	wc := h.workers[workerID]
	if wc == nil {
		return false
	}
	// Encoded first: a worker taken out of the routing must be told, or it idles
	// connected for good.
	b, err := frame.Encode(nil, &pb.Envelope{Body: &pb.Envelope_Drain{Drain: &pb.Drain{Reason: strings.ToValidUTF8(reason, "\uFFFD")}}})
	if err != nil {
		h.log.Error().Err(err).Str("worker_id", workerID).Msg("encode drain")
		return false
	}
	wc.drained = true
	if out, err := h.sched.SetAccepting(workerID, false); err == nil {
		h.apply(out)
	}
	wc.send(b)
	return true
}

func (h *hub) onStatus(wc *workerConn, st *pb.WorkerStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers[wc.id] != wc || wc.drained {
		return
	}
	out, err := h.sched.SetAccepting(wc.id, st.GetAccepting())
	if err == nil {
		h.apply(out)
	}
}

// onInventory replaces a worker's loadable labels, which its agent reports when its
// backend's change (a model added to Triton's repository).
func (h *hub) onInventory(wc *workerConn, inv *pb.Inventory) {
	labels := inv.GetLoadableLabels()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers[wc.id] != wc {
		return
	}
	out, err := h.sched.SetLoadable(wc.id, labels)
	if err != nil {
		return
	}
	wc.loadable = sortedLabels(labels)
	h.apply(out)
	h.log.Info().Str("worker_id", wc.id).Int("loadable_labels", len(labels)).Msg("worker's loadable labels changed")
}

// sortedLabels is a sorted copy of labels, nil for none.
func sortedLabels(labels []string) []string {
	if len(labels) == 0 {
		return nil
	}
	return slices.Sorted(slices.Values(labels))
}

// workerIDs lists connected workers, sorted.
func (h *hub) workerIDs() []string {
	ids := h.workerIDsLocked()
	sort.Strings(ids) // after the lock: the longer part with 10,000 workers
	return ids
}

// workerIDsLocked lists connected workers in no order, under one hold of the lock.
func (h *hub) workerIDsLocked() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.workers))
	for id := range h.workers {
		ids = append(ids, id)
	}
	return ids
}

// workerDetail is the JSON shape of GET /workers?detail=true entries.
type workerDetail struct {
	ID             string    `json:"id"`
	Labels         []string  `json:"labels"`
	MaxLabels      int       `json:"max_labels"`
	Slots          int       `json:"slots"`
	Running        int       `json:"running"`
	Busy           bool      `json:"busy"`
	Accepting      bool      `json:"accepting"`
	ConnectedSince time.Time `json:"connected_since"`
	Agent          string    `json:"agent,omitempty"`
	// Loadable lists the labels its backend can load, sorted (its hello's, or the last
	// Inventory's); absent when it can load any label. Shared with the connection.
	Loadable []string `json:"loadable,omitempty"`
}

// workerDetails is every registered worker's detail, sorted by id. The result is
// shared with concurrent callers (see fleetViews): read it, never change it.
func (h *hub) workerDetails() []workerDetail {
	return h.views.get(h.walkWorkers)
}

// labelHolders maps each held label to its workers, sorted.
func (h *hub) labelHolders() map[string][]string {
	out := make(map[string][]string)
	for _, w := range h.workerDetails() { // by id: each label's holders come out sorted
		for _, l := range w.Labels {
			out[l] = append(out[l], w.ID)
		}
	}
	return out
}

// viewChunk is how many workers a fleet walk reads per hold of the hub's lock, which
// no task is routed without: about 25 µs here. Reading 10,000 workers in one hold
// took 3–5 ms, and a few clients polling the views kept the lock held most of the
// time (BenchmarkRunTaskWhileOpsPolled).
const viewChunk = 128

// walkWorkers reads every registered worker's detail, sorted by id, viewChunk workers
// per hold of the lock. Each entry is one instant's view of its worker; the whole is
// not one instant: a worker that comes or goes during the walk may be in it or not,
// and one registered before the walk began and still there at its end always is.
func (h *hub) walkWorkers() []workerDetail {
	ids := h.workerIDs() // one short hold; sorted after it
	out := make([]workerDetail, 0, len(ids))
	labels := make([]string, 0, 2*len(ids)) // all views' labels, in a few arrays
	for len(ids) > 0 {
		chunk := ids[:min(viewChunk, len(ids))]
		ids = ids[len(chunk):]
		h.mu.Lock()
		for _, id := range chunk {
			wc := h.workers[id] // a replaced connection's successor, if the id reconnected
			if wc == nil {
				continue // gone since
			}
			v, rest, ok := h.sched.AppendWorker(labels, id)
			labels = rest
			if !ok {
				continue
			}
			held := v.Labels
			if held == nil {
				held = []string{}
			}
			out = append(out, workerDetail{ID: id, Labels: held, MaxLabels: v.MaxLabels, Slots: v.Slots, Running: v.Running,
				Busy: v.Running >= v.Slots, Accepting: v.Accepting, ConnectedSince: wc.connectedAt, Agent: wc.agent,
				Loadable: wc.loadable}) // shared: replaced, never changed in place
		}
		h.mu.Unlock()
		if h.cfg.onViewChunk != nil {
			h.cfg.onViewChunk()
		}
	}
	return out
}

// fleetViews runs one fleet walk at a time for GET /workers?detail=true and GET
// /labels. A request that comes during a walk waits for the next one, which serves
// every request that came meanwhile: however many clients poll, at most one walk
// takes turns with the routing for the lock. A request is never served a walk that
// began before it came, so a worker welcomed before it is in its view, as without the
// sharing.
type fleetViews struct {
	mu      sync.Mutex
	cur     *fleetWalk // running; nil when none is
	next    *fleetWalk // to run once cur ends, by the request that made it
	waiting int        // requests waiting for a walk to end (for tests)
}

type fleetWalk struct {
	done    chan struct{} // closed once workers is set
	workers []workerDetail
}

func (v *fleetViews) get(walk func() []workerDetail) []workerDetail {
	v.mu.Lock()
	if v.cur == nil {
		w := &fleetWalk{done: make(chan struct{})}
		v.cur = w
		v.mu.Unlock()
		return v.run(w, walk)
	}
	v.waiting++
	if w := v.next; w != nil {
		v.mu.Unlock()
		<-w.done
		v.doneWaiting()
		return w.workers
	}
	w := &fleetWalk{done: make(chan struct{})}
	v.next = w
	prev := v.cur
	v.mu.Unlock()
	<-prev.done // run made w the current walk as prev ended
	v.doneWaiting()
	return v.run(w, walk)
}

func (v *fleetViews) doneWaiting() {
	v.mu.Lock()
	v.waiting--
	v.mu.Unlock()
}

// run runs walk as w, then makes the next walk current, even if walk panics: the
// requests waiting on it must not wait for ever, nor every later one behind them.
func (v *fleetViews) run(w *fleetWalk, walk func() []workerDetail) []workerDetail {
	defer func() {
		v.mu.Lock()
		v.cur, v.next = v.next, nil
		v.mu.Unlock()
		close(w.done)
	}()
	w.workers = walk()
	return w.workers
}

// beginShutdown refuses new tasks and workers and returns a channel closed once no
// task is in flight.
func (h *hub) beginShutdown() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closing {
		h.closing = true
		// Queued journaled tasks need not hold shutdown up: the next start runs them.
		// Running ones are watched in case they come back to the queue.
		for _, rec := range h.active {
			if !rec.journaled {
				continue
			}
			if h.sched.Cancel(&rec.sched) {
				h.releaseLocked(rec)
			} else {
				h.running = append(h.running, rec)
			}
		}
	}
	ch := make(chan struct{})
	if len(h.active) == 0 {
		close(ch)
	} else {
		h.idle = ch
	}
	return ch
}

// releaseLocked lets go of a journaled task at shutdown without answering it in the
// journal, which keeps it for the next start. A producer may still wait on it (a
// synchronous resubmission of an accepted id): it gets a 503 that says so instead of
// waiting until its connection is cut. Caller holds mu; rec moves to h.released (read
// under mu, for GET /tasks/{id}), and nothing changes it after done is closed.
func (h *hub) releaseLocked(rec *taskRecord) {
	delete(h.active, rec.sched.ID)
	if h.released == nil {
		h.released = make(map[string]*taskRecord)
	}
	h.released[rec.sched.ID] = rec
	rec.params = nil // the journal holds them for the next start
	rec.httpStatus = http.StatusServiceUnavailable
	rec.errMsg = "dispatcher shutting down; task " + rec.sched.ID + " is journaled and runs when the dispatcher starts again"
	rec.retryAt = h.clock.Now().Add(unavailableRetryAfter)
	close(rec.done)
}

// markReleased writes to the journal how many times each task let go at this
// shutdown was started, so that the next start charges them with exactly that rather
// than one more (see recover). Called once no task is released any more.
func (h *hub) markReleased() {
	if h.journal == nil {
		return
	}
	h.mu.Lock()
	entries := make([]journalEntry, 0, len(h.released))
	for _, rec := range h.released {
		entries = append(entries, journalEntry{ID: rec.sched.ID, Created: rec.run(), Attempts: rec.sched.Attempt})
	}
	h.mu.Unlock()
	if err := h.journal.markReleased(entries); err != nil {
		h.log.Error().Err(err).Int("tasks", len(entries)).Msg("journal: starts of released tasks not written; the next start charges them one more")
	}
}

// unavailableRetryAfter is the Retry-After of the 503s that say "not now" (shutting
// down, the journal's disk failing): a replacement dispatcher (or this one restarted)
// is usually up by then.
const unavailableRetryAfter = 5 * time.Second

// failAll answers every unfinished task, except journaled ones, which are left in
// the journal for the next start; used when shutdown runs out of time.
func (h *hub) failAll(reason string) (failed, kept int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, rec := range h.active {
		// Let go of the task first, so that no later event re-assigns an answered task.
		workerID := rec.sched.WorkerID()
		if !h.sched.Cancel(&rec.sched) && h.sched.Abandon(&rec.sched) {
			// Its worker would run it to the end for nobody: the answer is given here,
			// or the journal runs it again at the next start.
			if wc := h.workers[workerID]; wc != nil {
				h.sendControl(wc, &pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{
					TaskId: rec.sched.ID, Attempt: uint32(rec.sched.AttemptNumber()), Reason: reason}}})
			}
		}
		if rec.journaled {
			h.releaseLocked(rec) // the journal holds it: the next start runs it
			kept++
			continue
		}
		h.met.failedTask(rec, failShutdown)
		rec.retryAt = h.clock.Now().Add(unavailableRetryAfter)
		h.finish(rec, statusFailed, http.StatusServiceUnavailable, reason)
		failed++
	}
	return failed, kept
}

// connections lists the connected workers' connections.
func (h *hub) connections() []*workerConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	conns := make([]*workerConn, 0, len(h.workers))
	for _, wc := range h.workers {
		conns = append(conns, wc)
	}
	return conns
}

// closeWorkers disconnects every worker with a reason and returns their connections.
func (h *hub) closeWorkers(d *Disconnect) []*workerConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	conns := make([]*workerConn, 0, len(h.workers))
	for _, wc := range h.workers {
		conns = append(conns, wc)
		wc.close(d)
	}
	return conns
}

// ceilMilli rounds a deadline up to whole milliseconds for the wire, so that a worker
// never gives up before the dispatcher's own deadline.
func ceilMilli(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.Sub(time.UnixMilli(ms)) > 0 {
		ms++
	}
	return ms
}

var errNoUploader = errors.New("no uploader service is configured (start the dispatcher with --uploader-url)")
