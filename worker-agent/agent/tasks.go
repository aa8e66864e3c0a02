package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/backend"
)

// resultOverhead is room left in a frame for the result's other fields.
const resultOverhead = 4 << 10

// errDeadline is the cause of a task context whose deadline_unix_ms passed.
var errDeadline = errors.New("deadline exceeded")

// cancelledError is the cause of a task context the dispatcher cancelled.
type cancelledError struct{ reason string }

func (e *cancelledError) Error() string {
	if e.reason == "" {
		return "cancelled: by the dispatcher"
	}
	return "cancelled: " + e.reason
}

// taskKey names one attempt of a task on the session it was assigned on. Numbers are
// the dispatcher's, and they may come again on a new connection: a dispatcher forgets
// the number of an attempt its worker overran when the worker leaves, and a restarted
// one never knew it, while the abandoned attempt may still be in a backend call that
// ignores cancellation.
type taskKey struct {
	id      string
	attempt uint32
	session uint64
}

// runningTask is an attempt in flight; the entry lives in agent.tasks until its result
// has been handed to the writer.
type runningTask struct {
	// cancelCtx ends the attempt's context and cause says why (a Cancel frame,
	// shutdown). One plain context per attempt, not a cause-carrying one under a
	// deadline one: two contexts per task were a tenth of an agent's CPU.
	cancelCtx context.CancelFunc
	cause     error     // guarded by agent.mu
	s         *session  // the session it was assigned on, where its result goes
	holdsSlot bool      // counted in s.tasks; false once the result is about to go out
	deadline  time.Time // zero: none
}

// cancel ends the attempt with cause (nil only releases the context); the first
// cause counts. Caller holds agent.mu.
func (rt *runningTask) cancel(cause error) {
	if rt.cause == nil {
		rt.cause = cause
	}
	rt.cancelCtx()
}

// cancelCause says why an attempt's context ended: the first cause it was cancelled
// with (its deadline, a Cancel frame, shutdown).
func (a *agent) cancelCause(ctx context.Context, key taskKey) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rt := a.tasks[key]; rt != nil && rt.cause != nil {
		return rt.cause
	}
	return context.Cause(ctx)
}

// deadlineClock is what task deadlines read the time and arm their timer with: the
// wall clock unless a test gives its own (testHooks.clock).
type deadlineClock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) deadlineTimer
}

// deadlineTimer is the part of *time.Timer that deadlines use.
type deadlineTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

// deadlineClock is the test's clock, if any.
func (h *testHooks) deadlineClock() deadlineClock {
	if h == nil {
		return nil
	}
	return h.clock
}

// now is the time deadlines are measured against.
func (a *agent) now() time.Time {
	if a.clock != nil {
		return a.clock.Now()
	}
	return time.Now()
}

// armDeadline makes sure expireTasks runs by d. One timer serves every attempt: it is
// armed for the earliest deadline and, when it fires, re-armed for the next one.
// Caller holds a.mu.
func (a *agent) armDeadline(d time.Time) {
	if !a.deadlineAt.IsZero() && !d.Before(a.deadlineAt) {
		return
	}
	a.deadlineAt = d
	switch {
	case a.deadlineTimer != nil:
		a.deadlineTimer.Reset(d.Sub(a.now()))
	case a.clock != nil:
		a.deadlineTimer = a.clock.AfterFunc(d.Sub(a.now()), a.expireTasks)
	default:
		a.deadlineTimer = time.AfterFunc(time.Until(d), a.expireTasks)
	}
}

// expireTasks cancels the attempts whose deadline has passed and re-arms the timer
// for the next deadline.
func (a *agent) expireTasks() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.deadlineAt = time.Time{}
	var next time.Time
	for _, rt := range a.tasks {
		switch {
		case rt.deadline.IsZero():
		case !now.Before(rt.deadline):
			rt.cancel(errDeadline)
		case next.IsZero() || rt.deadline.Before(next):
			next = rt.deadline
		}
	}
	if !next.IsZero() {
		a.armDeadline(next)
	}
}

// stopTasks cancels every attempt for shutdown and stops the deadline timer.
func (a *agent) stopTasks() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rt := range a.tasks {
		rt.cancel(errShutdown)
	}
	if a.deadlineTimer != nil {
		a.deadlineTimer.Stop()
	}
}

// outcome is how an attempt went, for its result and its log record.
type outcome struct {
	label   acquireInfo
	run     time.Duration
	result  []byte
	err     error
	discard bool // send no result: the work was abandoned and the dispatcher re-queues it
	refused bool // the attempt never started: the dispatcher runs it elsewhere
	// loadFailed: the label failed to load here; the dispatcher runs the task elsewhere.
	loadFailed bool
}

// deadlineExceeded reports whether the attempt ended because its deadline passed.
func (o outcome) deadlineExceeded() bool { return errors.Is(o.err, errDeadline) }

// metricResult is the result label of smartroute_agent_tasks_total.
func (o outcome) metricResult(delivered bool) string {
	switch {
	case !delivered:
		return taskDiscarded
	case o.refused:
		return taskRefused
	case o.err == nil:
		return taskOK
	case o.deadlineExceeded():
		return taskDeadline
	}
	return taskError
}

// assign starts an assignment in its own goroutine or refuses it at once. It runs on
// the reader and never blocks.
func (a *agent) assign(s *session, asg *pb.TaskAssignment) {
	// Read only for the "task completed" record's total_ms: with that record off (the
	// throughput benchmark's warn level), a clock read per task for nothing.
	var received time.Time
	if a.taskLogged() {
		received = time.Now()
	}
	key := taskKey{id: asg.GetTaskId(), attempt: asg.GetAttempt(), session: s.id}
	var refusal string
	// Refusals of a well-formed assignment say so, so that the dispatcher requeues the
	// task instead of failing it; a malformed one is the task's own error.
	refused := true
	a.mu.Lock()
	switch {
	case key.id == "":
		refusal, refused = "assignment has no task_id", false
	case asg.GetLabel() == "":
		refusal, refused = "assignment has no label", false
	case a.draining:
		refusal = "worker draining"
	case !a.available:
		refusal = a.unavailableReason
	case a.tasks[key] != nil:
		a.mu.Unlock()
		s.log.Warn().Str("task_id", key.id).Uint32("attempt", key.attempt).Msg("ignoring a duplicate assignment")
		return
	case s.tasks >= a.cfg.Slots:
		// Counted per session: attempts of a lost connection, cancelled by abandon but
		// perhaps not yet returned from the backend, do not hold up the new one's work.
		refusal = fmt.Sprintf("no free slot: this worker runs %d task(s) at once", a.cfg.Slots)
	default:
		// Not a child of workCtx, and no deadline timer of its own: registering with a
		// parent and arming a timer were a seventh of an agent's CPU per task. Shutdown
		// (stopTasks) and deadlines (expireTasks) cancel it through a.tasks instead.
		ctx, cancel := context.WithCancel(context.Background())
		rt := &runningTask{cancelCtx: cancel, s: s, holdsSlot: true}
		if ms := asg.GetDeadlineUnixMs(); ms > 0 {
			rt.deadline = time.UnixMilli(ms)
			now := received
			switch {
			case a.clock != nil:
				now = a.clock.Now()
			case now.IsZero():
				now = time.Now()
			}
			if now.Before(rt.deadline) {
				a.armDeadline(rt.deadline)
			} else {
				rt.cancel(errDeadline) // over before it began
			}
		}
		if a.workCtx.Err() != nil { // shutting down: stopTasks may have run already
			rt.cancel(errShutdown)
		}
		a.tasks[key] = rt
		s.tasks++
		a.mu.Unlock()
		a.startTask(taskJob{ctx: ctx, rt: rt, s: s, asg: asg, key: key, received: received})
		return
	}
	a.mu.Unlock()
	a.finish(s, asg, received, outcome{err: errors.New(refusal), refused: refused})
	a.confirmKept(asg)
}

// confirmKept tells the dispatcher, after an attempt's result, that the label its
// assignment named for eviction is still loaded. The dispatcher drops that label from
// its view when it assigns; an attempt that never started its load (refused, over
// before it began), found room, had to evict another label, or whose eviction failed
// leaves it here, and so may one that gave up while the eviction ran (told when the
// unload fails). After the result, so that the dispatcher has first let go of a load
// that did not happen and has room in its view for the label again.
func (a *agent) confirmKept(asg *pb.TaskAssignment) {
	if v := asg.GetEvictLabel(); v != "" {
		a.labels.confirmHeld(v)
	}
}

// taskJob is an accepted attempt on its way to a runner goroutine.
type taskJob struct {
	ctx      context.Context
	rt       *runningTask // its entry in a.tasks
	s        *session
	asg      *pb.TaskAssignment
	key      taskKey
	received time.Time
}

// startTask hands an attempt to an idle runner, or starts a new one. A goroutine per
// attempt grew its stack through the backend and the result's encoding every time:
// stack copying was a seventh of an agent's instructions per task. Runners keep their
// stacks between attempts.
func (a *agent) startTask(job taskJob) {
	a.runMu.Lock()
	if n := len(a.idleRunners); n > 0 {
		park := a.idleRunners[n-1]
		a.idleRunners = a.idleRunners[:n-1]
		a.runMu.Unlock()
		park <- job // buffered, and only this send: never blocks
		return
	}
	a.runMu.Unlock()
	go a.runner(job)
}

// runner runs attempts until more runners than slots would be idle, or the agent stops.
// An idle runner waits on a channel of its own, not on a shared one beside the
// agent's context: a select over the two was the largest part of the scheduler's
// cost per task in a GOMAXPROCS=1 agent.
func (a *agent) runner(job taskJob) {
	park := make(chan taskJob, 1)
	for {
		a.runTask(job.ctx, job.rt, job.s, job.asg, job.key, job.received)
		job = taskJob{} // hold no finished attempt's parameters while idle
		a.runMu.Lock()
		if a.runnersStopped || len(a.idleRunners) >= a.cfg.Slots {
			a.runMu.Unlock()
			return
		}
		a.idleRunners = append(a.idleRunners, park)
		a.runMu.Unlock()
		var ok bool
		if job, ok = <-park; !ok {
			return
		}
	}
}

// stopRunners ends the idle runners; a runner that finishes an attempt afterwards ends
// too. A later attempt (none comes once work stops) would get a runner of its own.
func (a *agent) stopRunners() {
	a.runMu.Lock()
	defer a.runMu.Unlock()
	a.runnersStopped = true
	for _, park := range a.idleRunners {
		close(park)
	}
	a.idleRunners = nil
}

// runTask acquires the task's label, runs the task and sends its result.
func (a *agent) runTask(ctx context.Context, rt *runningTask, s *session, asg *pb.TaskAssignment, key taskKey, received time.Time) {
	defer a.taskDone(key, rt)
	var o outcome
	lease, info, err := a.labels.acquire(ctx, asg.GetLabel(), asg.GetEvictLabel(), taskRef{id: key.id, attempt: key.attempt})
	o.label = info
	if err != nil {
		var le *loadError // not above: errors.As moves it to the heap
		o.loadFailed = errors.As(err, &le)
		// The label left the backend's repository, and the assignment crossed the
		// Inventory saying so: refused, the task runs elsewhere rather than fail.
		o.refused = errors.Is(err, errNotLoadable)
	}
	if err == nil {
		start := monotonic()
		o.result, err = a.backend.Run(ctx, backend.Task{
			ID:      key.id,
			Attempt: key.attempt,
			Type:    asg.GetTaskType(),
			Label:   asg.GetLabel(),
			Params:  asg.GetParametersJson(),
		})
		o.run = monotonic() - start
		a.metrics.ran(o.run)
		if errors.Is(err, backend.ErrNotLoaded) {
			// The backend lost the label and could not load it again: the dispatcher
			// runs the task where the label loads, and drops it from this worker. The
			// label is lost even when the attempt's context ended meanwhile (Triton's
			// reload runs on): the result then says why it ended, and EVICTED tells
			// the dispatcher.
			lease.lost()
			o.loadFailed = ctx.Err() == nil
		} else {
			lease.release()
		}
		if err == nil && len(o.result) > s.maxFrame-resultOverhead {
			err = fmt.Errorf("result of %d bytes does not fit in a frame (results up to %d bytes: the frame limit %d less %d for the other fields)",
				len(o.result), s.maxFrame-resultOverhead, s.maxFrame, resultOverhead)
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// The task's context ended: say why rather than how the backend noticed.
		err = a.cancelCause(ctx, key)
		o.discard = errors.Is(err, errShutdown)
	case errors.Is(err, backend.ErrUnavailable) && !errors.Is(err, backend.ErrNotLoaded):
		// Nothing reached the backend: the attempt never started, and the worker
		// takes no task until the health check finds the backend back.
		a.setAvailable(false, err.Error()) // it says "backend unavailable"
		o.refused, o.loadFailed = true, false
	}
	o.err = err
	// Free the slot before the result goes out: a dispatcher may send the next task
	// the moment it reads this result.
	a.releaseSlot(rt)
	a.finish(s, asg, received, o)
	a.confirmKept(asg)
	if o.loadFailed {
		// A load this attempt joined found no room: the label it was to evict stayed.
		// Told after this result too, since the LOADED sent when the unload failed
		// came while the dispatcher's view held this attempt's copy of the new label,
		// with no room for the kept one.
		var ee *evictError // not above: errors.As moves it to the heap
		if errors.As(o.err, &ee) && ee.label != asg.GetEvictLabel() {
			a.labels.confirmHeld(ee.label)
		}
	}
}

// releaseSlot gives back the session slot an attempt holds. rt is the attempt's entry
// in a.tasks, where it stays until taskDone (assign ignores a duplicate): no lookup.
func (a *agent) releaseSlot(rt *runningTask) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rt.holdsSlot {
		rt.holdsSlot = false
		rt.s.tasks--
	}
}

// taskDone forgets a finished attempt, after its result was queued, so that a drain
// waiting for no task to run finds every result queued. rt is a.tasks[key] (see
// releaseSlot).
func (a *agent) taskDone(key taskKey, rt *runningTask) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rt.cancel(nil)
	if rt.holdsSlot {
		rt.s.tasks--
	}
	delete(a.tasks, key)
	if len(a.tasks) == 0 && a.idle != nil {
		close(a.idle)
		a.idle = nil
	}
}

// taskLogged says whether finish writes its info-level record, as zerolog decides it
// (the logger's level and the global one); only then is an attempt's total time read.
func (a *agent) taskLogged() bool {
	return a.taskLog.GetLevel() <= zerolog.InfoLevel && zerolog.GlobalLevel() <= zerolog.InfoLevel
}

// monotonicBase is what monotonic counts from.
var monotonicBase = time.Now()

// monotonic reads the monotonic clock alone, for durations: time.Now reads the wall
// clock as well, nearly twice the cost, and the agent measures every task's run.
func monotonic() time.Duration { return time.Since(monotonicBase) }

// resultFrame is a result's envelope, oneof wrapper and message in one allocation
// rather than three: one is built per task.
type resultFrame struct {
	env  pb.Envelope
	body pb.Envelope_Result
	res  pb.TaskResult
}

// finish sends an attempt's result (unless discarded or the session is gone) and logs
// the "task completed" record the benchmark reads. load_ms and load_duration_us are the
// time the task waited for its label: its own load (label_miss), a load another task
// started (label_miss false), or room; zero on a plain hit.
func (a *agent) finish(s *session, asg *pb.TaskAssignment, received time.Time, o outcome) {
	var total time.Duration
	if !received.IsZero() { // zero: the record was off when the assignment came
		total = time.Since(received)
	}
	f := new(resultFrame)
	res := &f.res
	*res = pb.TaskResult{
		TaskId:           asg.GetTaskId(),
		Attempt:          asg.GetAttempt(),
		Ok:               o.err == nil,
		LabelMiss:        o.label.miss,
		LoadDurationUs:   o.label.wait.Microseconds(),
		RunDurationUs:    o.run.Microseconds(),
		EvictedLabel:     o.label.evicted,
		Refused:          o.refused,
		DeadlineExceeded: o.deadlineExceeded(),
		LoadFailed:       o.loadFailed && !o.deadlineExceeded(),
	}
	if o.err != nil {
		res.Error = frameText(o.err.Error())
	} else {
		res.Result = o.result
	}
	f.body.Result = res
	f.env.Body = &f.body
	delivered := !o.discard && s.send(&f.env)
	a.metrics.taskEnded(o.metricResult(delivered))

	// A result that never reaches the dispatcher gets its own event: the dispatcher
	// re-queues the task, and counting it as completed here would count it twice.
	ev := a.taskLog.Info().Str("event", "task_completed")
	msg := "task completed"
	switch {
	case !delivered:
		ev = a.taskLog.Info().Str("event", "task_discarded")
		msg = "task result discarded"
	case o.refused: // never ran: the dispatcher runs it elsewhere
		ev = a.taskLog.Info().Str("event", "task_refused")
		msg = "task refused"
	}
	ev = ev.
		Str("task_id", res.TaskId).
		Uint32("attempt", res.Attempt).
		Str("task_type", asg.GetTaskType()).
		Str("label", asg.GetLabel()).
		Bool("label_miss", res.LabelMiss).
		Float64("load_ms", millis(o.label.wait)).
		Float64("run_ms", millis(o.run)).
		Float64("total_ms", millis(total)).
		Bool("ok", res.Ok)
	if res.EvictedLabel != "" {
		ev = ev.Str("evicted_label", res.EvictedLabel)
	}
	if o.err != nil {
		ev = ev.Str("error", res.Error)
	}
	ev.Msg(msg)
}

// frameText makes backend-supplied text (an error from Triton, say) fit a frame's
// string field, which must be UTF-8: a frame that cannot be encoded would end the
// connection, and the task would come back to fail the same way.
func frameText(s string) string {
	return frame.CutText(strings.ToValidUTF8(s, "\uFFFD"), maxFrameText)
}

// maxFrameText bounds backend-supplied text in a frame (Triton's errors run to 64 KiB):
// with the other fields it stays inside resultOverhead, and so inside any frame limit
// the dispatcher accepts.
const maxFrameText = 2 << 10

// cancel ends the attempt a Cancel frame received on s names; attempt 0 means every
// attempt. Only s's: another session's attempts are abandoned already.
func (a *agent) cancel(s *session, c *pb.Cancel) {
	cause := &cancelledError{reason: c.GetReason()}
	a.mu.Lock()
	n := 0
	for key, rt := range a.tasks {
		if key.session == s.id && key.id == c.GetTaskId() && (c.GetAttempt() == 0 || key.attempt == c.GetAttempt()) {
			rt.cancel(cause)
			n++
		}
	}
	a.mu.Unlock()
	if n == 0 {
		s.log.Debug().Str("task_id", c.GetTaskId()).Uint32("attempt", c.GetAttempt()).Msg("cancel for a task not running here")
	}
}

// cancelTasks cancels every attempt in flight and returns how many there were.
func (a *agent) cancelTasks(cause error) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rt := range a.tasks {
		rt.cancel(cause)
	}
	return len(a.tasks)
}
